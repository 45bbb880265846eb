"""Settings from file, environment and flags; every bad value stops the start with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy import config
from proxy.core.errors import ConfigError
from proxy.settings import Settings

REPO = Path(__file__).resolve().parent.parent


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    file = write(tmp_path, "c.toml", 'upstream = "http://a:1"\ntokenizer = "t.gguf"\nport = 1000\n'
                 "idle_timeout = 5\nworkers = 2\n")  # fmt: skip
    env = {"CODEC_PROXY_PORT": "2000", "CODEC_PROXY_IDLE_TIMEOUT": "7.5", "HOME": "/x"}
    settings = config.load(file=file, env=env, flags={"port": 3000})
    assert settings.port == 3000  # flag beats environment beats file
    assert settings.idle_timeout == 7.5  # environment beats file
    assert settings.workers == 2  # file beats default
    assert settings.upstream == ("http://a:1",)
    assert settings.tokenizer == Path("t.gguf")


def test_yaml_and_lists(tmp_path: Path) -> None:
    file = write(tmp_path, "c.yaml", "upstream:\n  - http://a:1\n  - http://b:2\ntokenizer: t\n")
    assert config.load(file=file, env={}).upstream == ("http://a:1", "http://b:2")
    env = {"CODEC_PROXY_UPSTREAM": "http://c:3, http://d:4", "CODEC_PROXY_TOKENIZER": "t"}
    assert config.load(env=env).upstream == ("http://c:3", "http://d:4")


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ('upstreams = ["http://a"]', {}, r"c\.toml: unknown key 'upstreams'"),
        ("ttft_timeout = -1", {}, r"'ttft_timeout' must be >= 0, got -1"),
        ('port = "80"', {}, r"'port' must be an integer, got '80'"),
        ("port = 70000", {}, r"'port' must be <= 65535"),
        ("workers = true", {}, r"'workers' must be an integer, got True"),
        ('log_format = "xml"', {}, r"'log_format' must be one of 'json', 'text', got 'xml'"),
        ('upstream = "ftp://a"', {}, r"'upstream' must be an http:// or https:// URL"),
        ("", {"CODEC_PROXY_IDLE_TIMEOUT": "soon"}, r"'CODEC_PROXY_IDLE_TIMEOUT' must be a number"),
        ("", {"CODEC_PROXY_TYPO": "1"}, r"unknown variable 'CODEC_PROXY_TYPO'"),
        ("[table", {}, r"c\.toml: not valid TOML"),
    ],
)
def test_one_line_errors(tmp_path: Path, text: str, env: dict[str, str], message: str) -> None:
    base = 'upstream = "http://a:1"\ntokenizer = "t"\n'
    if text.startswith(("upstream", "[")):
        base = 'tokenizer = "t"\n'
    file = write(tmp_path, "c.toml", base + text + "\n")
    with pytest.raises(ConfigError, match=message) as caught:
        config.load(file=file, env=env)
    assert "\n" not in caught.value.message


def test_required_keys_name_every_way_to_set_them() -> None:
    with pytest.raises(ConfigError, match="--upstream, set CODEC_PROXY_UPSTREAM"):
        config.load(env={"CODEC_PROXY_TOKENIZER": "t"})


def test_secrets_never_printed(tmp_path: Path) -> None:
    settings = config.load(env={"CODEC_PROXY_UPSTREAM": "http://a", "CODEC_PROXY_TOKENIZER": "t",
                                "CODEC_PROXY_API_KEY": "sk-very-secret"})  # fmt: skip
    assert settings.api_keys() == {"sk-very-secret"}
    assert "sk-very-secret" not in repr(settings)
    assert "sk-very-secret" not in config.describe(settings)


def test_example_config_is_complete_and_current() -> None:
    # Every setting with its default and help: regenerate with `codec-proxy config-example`.
    path = REPO / "config" / "codec-proxy.example.toml"
    assert path.read_text() == config.example_toml()
    settings = config.load(file=path, env={})
    defaults = Settings(upstream=("http://x",), tokenizer=Path("t"))
    for name in config.setting_names():
        if name not in ("upstream", "tokenizer"):
            assert getattr(settings, name) == getattr(defaults, name), name


# ------------------------------------------------------------------------ key sources fail closed


def test_blank_lines_and_comments_in_a_key_file_are_not_keys(tmp_path: Path) -> None:
    text = "# rotated on Monday\n\n  key-a  \n   # key-b (revoked)\nkey-c\n"
    keys = write(tmp_path, "keys", text)
    settings = Settings(upstream=("http://a",), tokenizer=Path("t"), api_key_file=keys)
    assert settings.api_keys() == {"key-a", "key-c"}


@pytest.mark.parametrize(
    "text", ["", "\n", "  \n\t\n", "# keys rotate on Monday\n", "# a\n\n  # b\n"]
)
def test_a_key_file_that_holds_no_key_is_an_error(tmp_path: Path, text: str) -> None:
    keys = write(tmp_path, "keys", text)
    settings = Settings(
        upstream=("http://a",), tokenizer=Path("t"), api_key=("k",), api_key_file=keys
    )
    with pytest.raises(ConfigError, match=r"^'api_key_file' holds no API key") as caught:
        settings.api_keys()
    assert str(keys) not in caught.value.message  # the path is secret, like the keys


def test_a_key_file_that_cannot_be_read_is_an_error(tmp_path: Path) -> None:
    missing = Settings(upstream=("http://a",), tokenizer=Path("t"), api_key_file=tmp_path / "no")
    with pytest.raises(ConfigError, match=r"^cannot read 'api_key_file': No such file"):
        missing.api_keys()
    binary = tmp_path / "keys"
    binary.write_bytes(b"sk-\xff\xfe\n")
    garbled = Settings(upstream=("http://a",), tokenizer=Path("t"), api_key_file=binary)
    with pytest.raises(ConfigError, match=r"^'api_key_file' is not UTF-8 text$"):
        garbled.api_keys()


BASE = {"CODEC_PROXY_UPSTREAM": "http://a", "CODEC_PROXY_TOKENIZER": "t"}
EMPTY_KEY_SOURCES = {
    "api_key variable": (
        {"CODEC_PROXY_API_KEY": ""},
        "'CODEC_PROXY_API_KEY' is set but holds no key",
    ),
    "api_key variable of commas": (
        {"CODEC_PROXY_API_KEY": " , "},
        "'CODEC_PROXY_API_KEY' is set but holds no key",
    ),
    "api_key_file variable": (
        {"CODEC_PROXY_API_KEY_FILE": ""},
        "'CODEC_PROXY_API_KEY_FILE' is empty",
    ),
    "allow-list variable": (
        {"CODEC_PROXY_CODEC_ALLOW_KEYS": ""},
        "'CODEC_PROXY_CODEC_ALLOW_KEYS' is set but holds no key",
    ),
    "deny-list variable": (
        {"CODEC_PROXY_CODEC_DENY_KEYS": " "},
        "'CODEC_PROXY_CODEC_DENY_KEYS' is set but holds no key",
    ),
}


@pytest.mark.parametrize(("env", "message"), EMPTY_KEY_SOURCES.values(), ids=EMPTY_KEY_SOURCES)
def test_a_key_variable_set_but_empty_is_an_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^environment: {message}"):
        config.load(env={**BASE, **env})


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.toml", 'api_key_file = ""', "'api_key_file' is empty"),
        ("c.toml", 'api_key_file = "  "', "'api_key_file' is empty"),
        ("c.yaml", "api_key_file:", "'api_key_file' is empty"),
        ("c.toml", 'api_key = [" "]', "'api_key' must be a non-empty string"),
        ("c.toml", 'codec_deny_keys = ["k", ""]', "'codec_deny_keys' must be a non-empty string"),
    ],
)
def test_a_key_setting_present_but_empty_in_a_file_is_an_error(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    file = write(tmp_path, name, text + "\n")
    with pytest.raises(ConfigError, match=message):
        config.load(file=file, env=BASE)


def test_a_flag_naming_an_empty_key_file_is_an_error() -> None:
    with pytest.raises(ConfigError, match=r"^command line: 'api_key_file' is empty"):
        config.load(env=BASE, flags={"api_key_file": ""})


def test_no_keys_said_in_so_many_words_is_no_keys(tmp_path: Path) -> None:
    file = write(tmp_path, "c.toml", 'api_key_file = "none"\napi_key = []\ncodec_deny_keys = []\n')
    settings = config.load(file=file, env=BASE)
    assert (settings.api_key_file, settings.api_key, settings.codec_deny_keys) == (None, (), ())
    assert settings.api_keys() == frozenset()


# ------------------------------------------------------------------------ no secret in an error

SECRET = "sk-live-4b9f8e21"
NUMBER = "12345678901234"  # a key that TOML and YAML read as a number


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.yaml", f'api_key: "{SECRET}\n', "not valid YAML: found unexpected end of stream (at"),
        ("c.yaml", f"api_key: *{SECRET}\n", "not valid YAML: found undefined alias … (at line 3,"),
        ("c.yaml", f"api_key: !{SECRET} x\n", "for the tag … (at line 3, column 10)"),
        ("c.yaml", f"api_key:\n  - {SECRET}: x: y\n", "mapping values are not allowed here (at"),
        ("c.yaml", f'api_key: "{SECRET}\\q"\n', "found unknown escape character 'q' (at line"),
        ("c.toml", f'api_key = ["{SECRET}" "x"]\n', "not valid TOML: Unclosed array (at line 3,"),
        ("c.toml", f'api_key = "{SECRET}\n', r"not valid TOML: Illegal character '\n' (at line"),
        ("c.toml", f'codec_deny_keys = {{"{SECRET}" = 1, "{SECRET}" = 2}}\n', "table key … (at"),
    ],
)
def test_a_syntax_error_never_quotes_the_file(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    head = "upstream: http://a\ntokenizer: t\n"
    if name.endswith(".toml"):
        head = 'upstream = "http://a"\ntokenizer = "t"\n'
    file = write(tmp_path, name, head + text)
    with pytest.raises(ConfigError) as caught:
        config.load(file=file, env={})
    assert message in caught.value.message
    assert SECRET not in caught.value.message
    assert "\n" not in caught.value.message


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("c.toml", f"api_key = {NUMBER}", "'api_key' must be a list of a string, got an integer"),
        ("c.toml", f"api_key = [{NUMBER}]", "'api_key' must be a non-empty string, got an integer"),
        ("c.toml", f"api_key_file = {NUMBER}", "'api_key_file' must be a non-empty string, got an"),
        ("c.toml", f"codec_allow_keys = {NUMBER}.5", "'codec_allow_keys' must be a list of a st"),
        ("c.yaml", f"codec_deny_keys: {{{SECRET}: 1}}", "'codec_deny_keys' must be a list of a st"),
        ("c.yaml", f"codec_deny_keys: [[{SECRET}]]", "must be a non-empty string, got a list"),
    ],
)
def test_a_secret_of_the_wrong_type_is_not_echoed(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    file = write(tmp_path, name, text + "\n")
    env = {"CODEC_PROXY_UPSTREAM": "http://a", "CODEC_PROXY_TOKENIZER": "t"}
    with pytest.raises(ConfigError, match=r"\(secret: not shown\)$") as caught:
        config.load(file=file, env=env)
    assert message in caught.value.message
    assert SECRET not in caught.value.message
    assert NUMBER not in caught.value.message


def test_a_setting_that_is_not_secret_still_says_what_it_got(tmp_path: Path) -> None:
    file = write(tmp_path, "c.toml", 'upstream = "http://a"\ntokenizer = "t"\nport = "eighty"\n')
    with pytest.raises(ConfigError, match=r"'port' must be an integer, got 'eighty'$"):
        config.load(file=file, env={})


def test_a_config_file_that_is_not_utf8_is_one_line(tmp_path: Path) -> None:
    file = tmp_path / "c.toml"
    file.write_bytes(b'api_key = ["sk-\xff\xfe"]\n')
    with pytest.raises(ConfigError, match=r"c\.toml: not UTF-8 text$"):
        config.load(file=file, env={})
