"""Stop strings on the decoded text: matching across token boundaries, streaming holdback.

Token texts come from a table (each toy token decodes to 3 characters), so a stop string
taken from the middle of the reference text starts and ends inside tokens and spans two.
"""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from support.fakes import VOCAB, make_pair
from tokenrouter_backend.core.loop.block_loop import GenerationRequest, generate
from tokenrouter_backend.core.protocol.params import InvalidRequest, RouterDefaults
from tokenrouter_backend.core.text.detokenize import Detokenizer
from tokenrouter_backend.core.text.stop_text import StopText, TextHit, parse_stop_words

LETTERS = "abcdefghijklmnopqrstuvwxyz"
TABLE = {t: LETTERS[t % 26] + LETTERS[(t * 7 + 3) % 26] + (" " if t % 3 == 0 else LETTERS[(t * 5) % 26])
         for t in range(VOCAB)}
PROMPTS = [tuple(int(x) for x in np.random.default_rng(100 + i).integers(0, VOCAB, size=4)) for i in range(6)]


def decode(ids) -> str:
    return "".join(TABLE[int(i)] for i in ids)


def bytes_decode(table):
    return lambda ids: b"".join(table[int(i)] for i in ids).decode("utf-8", errors="replace")


def test_hit_that_starts_and_ends_inside_tokens():
    table = {0: "x", 1: "ret", 2: "urn;", 3: "y"}
    text = StopText(["turn"], lambda ids: "".join(table[i] for i in ids))
    assert text.find([0, 1, 2, 3]) == TextHit(keep=2, trim=1, end=3)  # "xre" stays
    assert text.find([0, 1]) is None
    assert text.safe_len([0, 1]) == 1  # "t" may begin "turn": "ret" is held back
    assert text.safe_len([0, 3]) == 2


def test_earliest_occurrence_wins_and_stop_at_token_boundary():
    table = {0: "ab", 1: "cd", 2: "ef"}
    text = StopText(["ef", "bc"], lambda ids: "".join(table[i] for i in ids))
    assert text.find([0, 1, 2]) == TextHit(keep=1, trim=1, end=2)
    assert StopText(["cd"], text.decode).find([0, 1, 2]) == TextHit(keep=1, trim=0, end=2)
    assert StopText(["ab"], text.decode).find([0, 1]) == TextHit(keep=0, trim=0, end=1)


def test_incomplete_multibyte_character_is_held_back():
    table = {0: b"a", 1: b"\xc3", 2: b"\xa9", 3: b"!"}  # "é" split over two tokens
    text = StopText(["\u00e9!"], bytes_decode(table))
    assert text.safe_len([0, 1]) == 1  # the half character could begin the stop string
    assert text.safe_len([0, 1, 2]) == 1  # "é" could still be followed by "!"
    assert text.find([0, 1, 2, 3]) == TextHit(keep=1, trim=0, end=4)


def test_parse_stop_words_errors_name_the_field():
    assert parse_stop_words([b"a", "b", b"a"]) == ("a", "b")
    with pytest.raises(InvalidRequest, match=r"stop_words\[1\] must be a non-empty string"):
        parse_stop_words(["x", b""])
    with pytest.raises(InvalidRequest, match=r"stop_words\[0\] is not valid UTF-8"):
        parse_stop_words([b"\xff"])
    with pytest.raises(InvalidRequest, match="at most 16"):
        parse_stop_words([str(i) for i in range(17)])
    with pytest.raises(InvalidRequest, match="at most 256"):
        parse_stop_words(["x" * 257])


def test_detokenizer_trims_the_final_text():
    class Tok:
        def decode(self, ids, skip_special_tokens=True):
            return decode(ids)

    detok = Detokenizer(Tok())
    assert detok.delta([1, 2, 3], 1, True, trim=2) == TABLE[2] + TABLE[3][:1]
    assert detok.delta([1, 2], 0, True) == TABLE[1] + TABLE[2]


def run(prompt, mode, stop=None, **given):
    params = RouterDefaults().request_params({"router_mode": mode, "max_tokens": 24, "block_size": 5, **given})
    emitted, last = [], {}

    def emit(tokens, stats, finished):
        emitted.append((list(tokens), finished))
        last["trim"] = stats.stop_trim_chars

    request = GenerationRequest(prompt, params, stop_text=StopText([stop], decode) if stop else None)
    stats = asyncio.run(generate(request, *make_pair(), emit, session_id=4))
    out = [t for chunk, _ in emitted for t in chunk]
    streamed = [t for chunk, final in emitted if not final for t in chunk]
    text = decode(out)
    return text[: len(text) - last["trim"]], decode(streamed), stats


MODES = [("heavy", {}), ("light", {}), ("verify", {}), ("route", {"rollback_threshold": 0.0})]


@pytest.mark.parametrize("mode,knobs", MODES)
@pytest.mark.parametrize("first,last", [(4, 8), (7, 11), (1, 5), (31, 52), (40, 44)])
def test_stop_string_inside_tokens_in_the_first_block(mode, knobs, first, last):
    # chars 4..8 start inside token 1 and end inside token 2: both in the first block (5
    # tokens = 15 characters); 31..52 spans eight tokens across block boundaries
    for prompt in PROMPTS:
        ref, _, ref_stats = run(prompt, mode, **knobs)
        word = ref[first:last]
        cut = ref.find(word)
        text, streamed, stats = run(prompt, mode, stop=word, **knobs)
        assert text == ref[:cut] and stats.finish_reason == "stop_words", (prompt, word)
        assert word not in text and ref[:cut].startswith(streamed)  # nothing taken back


@pytest.mark.parametrize("mode,knobs", MODES)
def test_stream_holds_back_only_a_possible_stop_start(mode, knobs):
    prompt = PROMPTS[0]
    ref, _, _ = run(prompt, mode, **knobs)
    word = ref[30:33] + "#"  # never occurs ("#" is in no token): the answer runs to max_tokens
    text, streamed, stats = run(prompt, mode, stop=word, **knobs)
    assert text == ref and stats.finish_reason == "length"
    assert ref.startswith(streamed) and len(streamed) > 30  # streaming went on past most of it


def test_router_request_stop_words_need_a_tokenizer():
    from tokenrouter_backend.serving.request import stop_text

    words = (b"ab", b"c")  # as RouterInputs holds them
    assert stop_text((), decode) is None
    assert stop_text(words, decode).strings == ("ab", "c")
    with pytest.raises(InvalidRequest, match="router's tokenizer"):
        stop_text(words, None)
