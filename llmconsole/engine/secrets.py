"""What counts as a secret, decided in one place for the spec, the store and exports.

A secret is a value that grants access: the engine's API key, and the value of anything whose
NAME says it is a credential (HF_TOKEN, OPENAI_API_KEY, OPENAI_KEY, CLIENT_SECRET, DB_PASSWORD,
DB_PASS, ENCRYPTION_KEY, BASIC_AUTH, `--hf-token`, an `Authorization` header). The test is on the name's words, so a token count
(`max_num_batched_tokens`) or a tokenizer setting (`--tokenizer-mode`, TOKENIZERS_PARALLELISM)
is not a secret and is kept as it is.

Where a secret's value would be stored or shown, SECRET_VALUE stands in for it; the name stays,
so what ran can still be told apart and a rollback knows which value to take back from the
daemon's private state file.
"""

from __future__ import annotations

import re

SECRET_VALUE = "<redacted>"

# Names that look like a credential's but say only whether one exists.
_NOT_SECRET = {"api_key_set"}
_SPLIT = re.compile(r"[^a-z0-9]+")
# A word of the name that alone makes it a credential's: DB_PASS, BASIC_AUTH, GH_PRIVATE,
# GOOGLE_APPLICATION_CREDENTIALS. Whole words only, so PASSTHROUGH or AUTHOR are not.
_WHOLE_WORDS = {
    "authorization",
    "auth",
    "credential",
    "credentials",
    "pass",
    "passwd",
    "passphrase",
    "private",
    "apikey",
}
_KEY_AFTER = {"api", "access", "private", "secret"}  # API_KEY_ID, access-key-file, private_key_path


def is_secret_name(name: str) -> bool:
    """Whether a value under `name` (an env var, a flag, a JSON key) is a credential.

    KEY is a credential as the last word of a longer name (OPENAI_KEY, ENCRYPTION_KEY, DB_KEY),
    or anywhere after API/ACCESS/PRIVATE/SECRET; not alone (a JSON "key") nor first or inside
    (key_source, num_key_value_heads, --ssl-keyfile)."""
    if name in _NOT_SECRET:
        return False
    words = [w for w in _SPLIT.split(name.lower()) if w]
    for i, w in enumerate(words):
        if w.endswith("token") and i == len(words) - 1:
            return True  # token, hf_token, HFTOKEN, accesstoken; not tokens, tokenizer, token_threshold
        if "secret" in w or "password" in w or w in _WHOLE_WORDS or w.endswith("apikey"):
            return True
        if w == "key" and i > 0 and (i == len(words) - 1 or words[i - 1] in _KEY_AFTER):
            return True
    return False
