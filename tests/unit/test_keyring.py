"""SINAL_SECRET_KEYS and the sealed values its keys make (no I/O)."""

from __future__ import annotations

import base64

import pytest

from sinal.config import Settings
from sinal.errors import ConfigurationError, SecretUnreadable
from sinal.keyring import (
    PLAINTEXT,
    Keyring,
    new_key,
    open_all,
    open_value,
    parse_keyring,
    reseal_all,
    seal_all,
    sealed_with,
)

K1 = "k1:" + base64.b64encode(bytes(range(32))).decode()
K2 = "k2:" + base64.urlsafe_b64encode(bytes(range(100, 132))).decode()
PLACE = "integrations/acct/one"


def ring(text: str) -> Keyring:
    keyring = parse_keyring(text)
    assert keyring is not None
    return keyring


def test_keyring_parses_ids_in_order_the_first_current() -> None:
    keyring = ring(f"{K2}, {K1}")

    assert keyring.ids == ("k2", "k1")
    assert keyring.current_id == "k2"
    assert "k2" not in repr(keyring)  # no key material either: the keys are left out
    assert K1.split(":")[1] not in repr(keyring)


@pytest.mark.parametrize("text", ["", "   "])
def test_keyring_empty_is_none(text: str) -> None:
    assert parse_keyring(text) is None


SHORT = base64.b64encode(b"x" * 16).decode()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("k1", "SINAL_SECRET_KEYS: key 1 must be ID:KEY"),
        (f"{K1},bad id:{SHORT}", "SINAL_SECRET_KEYS: key 2 must be ID:KEY"),
        (f"{K1},", "SINAL_SECRET_KEYS: key 2 must be ID:KEY"),
        ("k1:not base64!", "SINAL_SECRET_KEYS: key 1 (k1) must be the base64 of 32 random bytes"),
        (f"k1:{SHORT}", "SINAL_SECRET_KEYS: key 1 (k1) must be the base64 of 32 random bytes"),
        (f"{K1},{K1}", "SINAL_SECRET_KEYS: key 2: the id 'k1' is given twice"),
    ],
    ids=["no_colon", "bad_id", "empty_item", "not_base64", "16_bytes", "twice"],
)
def test_keyring_malformed_names_the_variable_never_the_key(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_keyring(text)

    assert str(caught.value).startswith(message)
    assert SHORT not in str(caught.value)
    assert K1.split(":")[1] not in str(caught.value)


def test_settings_refuse_a_malformed_secret_keys_and_never_show_it() -> None:
    with pytest.raises(ConfigurationError, match=r"^SINAL_SECRET_KEYS: key 1 \(k1\)"):
        Settings.from_env({"SINAL_SECRET_KEYS": f"k1:{SHORT}"})
    settings = Settings.from_env({"SINAL_SECRET_KEYS": K1})

    assert settings.keyring() == ring(K1)
    assert K1.split(":")[1] not in repr(settings)
    assert Settings.from_env({}).keyring() is None


def test_new_key_is_one_the_variable_takes() -> None:
    made = new_key("k3")

    assert ring(made).current_id == "k3"
    assert new_key("k3") != made
    with pytest.raises(ConfigurationError):
        new_key("no spaces")


def test_seal_then_open_gives_the_text_back_and_the_seal_names_its_key() -> None:
    keyring = ring(f"{K2},{K1}")
    stored = seal_all(keyring, {"access_token": "EAAG-tóken", "verify_token": ""}, PLACE)

    assert [sealed_with(v) for v in stored.values()] == ["k2", "k2"]
    assert "EAAG" not in str(stored)
    assert open_all(keyring, stored, PLACE) == {"access_token": "EAAG-tóken", "verify_token": ""}
    assert open_all(ring(f"{K1},{K2}"), stored, PLACE)["access_token"] == "EAAG-tóken"


def test_seal_differs_each_time() -> None:
    keyring = ring(K1)

    assert keyring.seal("same", PLACE) != keyring.seal("same", PLACE)


def test_plaintext_reads_as_it_is_and_stays_without_a_keyring() -> None:
    assert open_all(ring(K1), {"secret": "s"}, PLACE) == {"secret": "s"}
    assert seal_all(None, {"secret": "s"}, PLACE) == {"secret": "s"}
    assert sealed_with("s") == PLAINTEXT


def test_open_with_a_ring_lacking_the_key_names_it() -> None:
    sealed = ring(K1).seal("s", f"{PLACE}/secret")

    with pytest.raises(SecretUnreadable) as caught:
        open_value(ring(K2), sealed, f"{PLACE}/secret")

    assert caught.value.key_id == "k1"
    assert str(caught.value) == (
        f"the secret {PLACE}/secret is sealed with key 'k1', which SINAL_SECRET_KEYS does not "
        "hold (it holds k2)"
    )
    with pytest.raises(SecretUnreadable, match="sealed with key 'k1', and SINAL_SECRET_KEYS is"):
        open_value(None, sealed, f"{PLACE}/secret")


@pytest.mark.parametrize("change", ["other_place", "other_field", "tampered", "truncated"])
def test_open_refuses_a_value_altered_or_sealed_for_another_place(change: str) -> None:
    keyring = ring(K1)
    sealed = keyring.seal("s", f"{PLACE}/secret")
    context = f"{PLACE}/secret"
    raw = base64.b64decode(sealed["sealed"])
    if change == "other_place":
        context = "integrations/acct/two/secret"
    elif change == "other_field":
        context = f"{PLACE}/access_token"
    elif change == "tampered":
        flipped = raw[:-1] + bytes([raw[-1] ^ 1])
        sealed = {**sealed, "sealed": base64.b64encode(flipped).decode()}
    else:
        sealed = {**sealed, "sealed": base64.b64encode(raw[:8]).decode()}

    with pytest.raises(SecretUnreadable, match="does not open with key 'k1': it was altered"):
        open_value(keyring, sealed, context)


def test_reseal_seals_plaintext_and_previous_keys_and_leaves_the_current() -> None:
    old, new = ring(K1), ring(f"{K2},{K1}")
    stored = {"secret": "plain", **seal_all(old, {"access_token": "t"}, PLACE)}

    fresh = reseal_all(new, stored, PLACE)

    assert fresh is not None
    assert [sealed_with(v) for v in fresh.values()] == ["k2", "k2"]
    assert open_all(ring(K2), fresh, PLACE) == {"secret": "plain", "access_token": "t"}
    assert reseal_all(new, fresh, PLACE) is None  # done: nothing to write


def test_reseal_leaves_a_value_that_is_no_text_alone() -> None:
    """Only texts are secrets: anything else found in the column is left, not a crash."""
    assert reseal_all(ring(K1), {"secret": None, "other": 5}, PLACE) is None
