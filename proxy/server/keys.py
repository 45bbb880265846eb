"""App-wide state the app factory sets for every handler: settings, the model's vocabulary
and the safety policy. Keys of anything with an owner module live beside that owner."""

from __future__ import annotations

from aiohttp import web

from proxy.core.safety.policy import SafetyPolicy
from proxy.settings import Settings
from proxy.tokenizers.vocabulary import Vocabulary

SETTINGS = web.AppKey("settings", Settings)
VOCABULARY = web.AppKey("vocabulary", Vocabulary)
# Set only when a policy is configured: `app.get(SAFETY_POLICY)` is None otherwise.
SAFETY_POLICY = web.AppKey("safety_policy", SafetyPolicy)
