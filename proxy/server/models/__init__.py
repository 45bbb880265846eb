"""What each served model is, built at start or on reload: tokenizer, map, pool, checks."""
