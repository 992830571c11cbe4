"""The demo's own words: a tokenizer shipped with radixtop and the conversations made with it."""

from __future__ import annotations

import random

from radixtop.gpu_backend.demo_text import (
    ASSISTANT_TURNS,
    DEMO_TOKENIZER,
    SYSTEM_PROMPTS,
    TOOL_LOOPS,
    USER_TURNS,
    DemoConversations,
)
from radixtop.gpu_backend.workload import ChatWorkload, WorkloadConfig


def test_every_demo_text_round_trips_through_the_tokenizer():
    texts = [*SYSTEM_PROMPTS, *(t for group in USER_TURNS for t in group), *ASSISTANT_TURNS,
             *(part for loop in TOOL_LOOPS for part in loop)]
    for text in texts:
        ids = DEMO_TOKENIZER.encode(" " + text)
        assert DEMO_TOKENIZER.unknown not in ids, text
        assert DEMO_TOKENIZER.decode(ids) == " " + text
    assert DEMO_TOKENIZER.decode(DEMO_TOKENIZER.encode("hello the")) == "<unk> the"  # hello: not in it
    assert DEMO_TOKENIZER.decode([10**6]) == "<unk>"  # an id from elsewhere decodes, never raises


def test_the_vocabulary_is_the_same_everywhere():
    # a fixed order: a trace recorded on one machine decodes the same on another
    assert DEMO_TOKENIZER.vocabulary[:7] == ["<|system|>", "<|user|>", "<|assistant|>", "<|tool_call|>",
                                             "<|tool_result|>", "<|end|>", "<unk>"]
    assert DEMO_TOKENIZER.vocabulary[7] == "\n"
    assert DEMO_TOKENIZER.vocabulary[8:] == sorted(DEMO_TOKENIZER.vocabulary[8:])


def test_the_text_workload_is_chats_and_agents_over_shared_system_prompts():
    config = WorkloadConfig(sessions=12, seed=3, text=True)
    workload = ChatWorkload(config)
    begun, finished = [], []
    for _ in range(40):
        for action in workload.step():
            (begun if action.kind == "begin" else finished if action.kind == "finish" else []).append(action)
    assert begun and finished
    prompts = DemoConversations(random.Random(0)).system_prompts
    for action in begun:
        text = DEMO_TOKENIZER.decode(action.input_ids)
        assert text.startswith("<|system|> You are") and text.endswith("<|assistant|>")
        assert any(action.input_ids[: len(p)] == p for p in prompts)  # a shared system prompt
    outputs = [DEMO_TOKENIZER.decode(a.output_ids) for a in finished]
    assert any("<|tool_call|>" in o for o in outputs)  # the coding agent's tool loops
    assert all(o.endswith("<|end|>\n") for o in outputs)
    # the same seed, the same traffic
    again = ChatWorkload(config)
    assert [a.input_ids for a in again.step()] == [a.input_ids for a in ChatWorkload(config).step()]
