"""One typed, layered place for llmconsole's settings: defaults < config.toml < environment <
flags. `llmconsole config show` prints each with its source; docs/settings.md lists them all.

The daemon and the console read their settings here, and only here is the environment read for
them; engine/ receives the resulting policies as typed values (import-linter keeps it from
importing this package)."""

from llmconsole.settings.fields import GROUPS, Settings, env_name, field_of, is_env_only, is_secret, leaf_keys
from llmconsole.settings.load import CONFIG_NAME, Origin, Resolved, SettingsError, default_config_file, load

__all__ = [
    "CONFIG_NAME",
    "GROUPS",
    "Origin",
    "Resolved",
    "Settings",
    "SettingsError",
    "default_config_file",
    "env_name",
    "field_of",
    "is_env_only",
    "is_secret",
    "leaf_keys",
    "load",
]
