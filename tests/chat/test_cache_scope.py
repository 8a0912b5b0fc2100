"""Whose prefix blocks a request may reuse (docs/kv-tier.md, "Whose blocks"): each user's own,
plus the server's default system prompt, which every user's conversations open with and
every user can read, so sharing it gives nothing away."""

from __future__ import annotations

from typing import Any

from django.test import override_settings

from inference.backends.embedded import EmbeddedClient
from inference.chat_template import Turn
from inference.client import prefix_cache_salt
from inference.engine import SamplingParams

DEFAULT_PROMPT = "You are the helpful assistant of this server. Answer briefly and kindly. " * 3
SECRET = "My bank PIN is 4931 and my mother's maiden name is Grabowska; keep it to yourself."


async def cached(client: EmbeddedClient, turns: list[Turn], owner: int) -> int:
    """Prompt tokens the KV cache held for this request of `owner`'s."""
    salt = prefix_cache_salt(owner)
    prompt = client.chat_prompt(turns, cache_salt=salt)
    sampling = SamplingParams(max_tokens=1, temperature=0.0)
    deltas = [d async for d in client.stream(prompt, sampling, cache_salt=salt)]
    return deltas[-1].figures.cached_tokens


def test_the_salt_is_per_user_keyed_by_the_secret_key_and_a_client_salt_only_splits_it() -> None:
    salt = prefix_cache_salt(1)
    assert prefix_cache_salt(1) == salt != prefix_cache_salt(2)
    # Not guessable from the user id alone: another SECRET_KEY gives another salt.
    with override_settings(SECRET_KEY="another-secret-key-entirely"):
        assert prefix_cache_salt(1) != salt
    mine = {prefix_cache_salt(1, s) for s in (None, "a", "b")}
    assert len(mine) == 3 and prefix_cache_salt(2, "a") not in mine


async def test_the_default_system_prompt_is_shared_and_what_follows_is_not(
    tiny_engine: EmbeddedClient, settings: Any
) -> None:
    settings.CHAT_DEFAULTS = {**settings.CHAT_DEFAULTS, "system_prompt": DEFAULT_PROMPT}
    system = Turn("system", DEFAULT_PROMPT)
    shared = tiny_engine.shared_prefix_tokens(
        tiny_engine.chat_prompt([system, Turn("user", SECRET)]).token_ids or []
    )
    assert shared >= 48  # the default prompt's system turn: several whole blocks
    assert await cached(tiny_engine, [system, Turn("user", SECRET)], owner=101) == 0
    # bob reuses the public system prompt's whole blocks, and not one block of alice's text:
    # the same count whether or not he sends her secret.
    bob_guess = await cached(tiny_engine, [system, Turn("user", SECRET)], owner=102)
    assert bob_guess == shared // 16 * 16
    carol_other = await cached(tiny_engine, [system, Turn("user", "Hello there!")], owner=103)
    assert carol_other == bob_guess
    # alice's own next request reuses all of hers.
    again = [system, Turn("user", SECRET + " Thanks.")]
    assert await cached(tiny_engine, again, owner=101) > bob_guess


async def test_a_system_prompt_of_a_users_own_is_not_shared(
    tiny_engine: EmbeddedClient, settings: Any
) -> None:
    settings.CHAT_DEFAULTS = {**settings.CHAT_DEFAULTS, "system_prompt": DEFAULT_PROMPT}
    own = [Turn("system", "Only I know this prompt: " + SECRET), Turn("user", "Hi")]
    assert await cached(tiny_engine, own, owner=201) == 0
    assert await cached(tiny_engine, own, owner=202) == 0
    assert await cached(tiny_engine, own, owner=201) >= 32


def test_upkeep_warms_the_default_prompt_for_everyone_and_a_users_own_prompt_for_them(
    make_user: Any, settings: Any
) -> None:
    from chatapp.chat.kv_warmup import most_used_system_prompts
    from chatapp.chat.models import Conversation

    settings.CHAT_DEFAULTS = {**settings.CHAT_DEFAULTS, "system_prompt": DEFAULT_PROMPT}
    alice, bob = make_user("alice"), make_user("bob")
    for owner, prompt in [
        (alice, DEFAULT_PROMPT),
        (alice, DEFAULT_PROMPT),
        (bob, DEFAULT_PROMPT),
        (alice, "Talk like a pirate."),
        (bob, "Talk like a pirate."),
    ]:
        Conversation.objects.create(owner=owner, system_prompt=prompt)
    found = most_used_system_prompts(5)
    # The default prompt once, shared (owner None); a user's own prompt once per user.
    assert found[0] == (DEFAULT_PROMPT, 3, None)
    assert sorted(found[1:]) == sorted(
        [("Talk like a pirate.", 1, alice.pk), ("Talk like a pirate.", 1, bob.pk)]
    )
