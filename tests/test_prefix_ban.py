"""Bans by prefix: with ban_prefix a completion may not even start with a banned text, however it is tokenised."""

from __future__ import annotations

from scorer_helpers import ScriptedDecoder

from fastscore.decode import END_OF_TURN, greedy_decode


def _id(tok, piece: str) -> int:
    token_id = tok._tok.token_to_id(piece)
    assert token_id is not None, piece
    return token_id


def _decode(tok, script, banned, ban_prefix, max_new_tokens=8):
    decoder = ScriptedDecoder(tok.vocab_size, script, fallback=_id(tok, "."))
    [out] = greedy_decode(decoder, [[1]], token_bytes=tok.token_bytes, stop_ids=tok.stop_ids,
                          max_new_tokens=max_new_tokens, banned=[banned], ban_prefix=ban_prefix)
    return out


def test_an_exact_ban_lets_the_banned_text_plus_a_suffix_through_and_a_prefix_ban_does_not(smollm_tokenizer):
    tok = smollm_tokenizer
    hello, world, bang, there, eot = (_id(tok, "Hello"), _id(tok, "Ġworld"), _id(tok, "!"), _id(tok, "Ġthere"),
                                      tok.end_of_turn_id)
    # The model's favourite reply is "Hello world", then "Hello world!"; second choice after "Hello": " there".
    script = {(): [hello], (hello,): [world, there], (hello, world): [eot, bang], (hello, world, bang): [eot],
              (hello, there): [eot]}
    exact = _decode(tok, script, ["Hello world"], ban_prefix=False)
    assert (tok.decode(exact.token_ids), exact.stopped_by) == ("Hello world!", END_OF_TURN)  # starts with the ban
    prefix = _decode(tok, script, ["Hello world"], ban_prefix=True)
    print(repr(tok.decode(prefix.token_ids)), prefix.banned_mass, prefix.banned_steps)
    assert tok.decode(prefix.token_ids) == "Hello there"
    assert prefix.banned_steps == 1 and prefix.banned_mass > 0.5  # " world" held nearly all the mass there


def test_a_prefix_ban_holds_whatever_tokens_spell_it_and_after_leading_whitespace(smollm_tokenizer):
    tok = smollm_tokenizer
    space, hel, lo, world, bang, eot = (_id(tok, "Ġ"), _id(tok, "Hel"), _id(tok, "lo"), _id(tok, "Ġworld"),
                                        _id(tok, "!"), tok.end_of_turn_id)
    # " " + "Hel" + "lo" + " world": the last token finishes the banned text and runs past it; its runner-up is "!".
    script = {(): [space], (space,): [hel], (space, hel): [lo], (space, hel, lo): [world, bang],
              (space, hel, lo, world): [eot], (space, hel, lo, bang): [eot]}
    free = _decode(tok, script, [], ban_prefix=True)
    assert tok.decode(free.token_ids) == " Hello world"
    out = _decode(tok, script, ["Hello wor"], ban_prefix=True)
    assert tok.decode(out.token_ids) == " Hello!" and out.banned_steps == 1
    assert _decode(tok, script, ["Goodbye"], ban_prefix=True).token_ids == free.token_ids  # nothing else moves
