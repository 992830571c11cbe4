"""The demo's words: a small word-level tokenizer shipped with radixtop (nothing downloaded) and
the conversations the demo workload is made of, so that a newcomer sees what a real prefix cache
holds: a few long system prompts shared by many sessions, multi-turn chats, and agents that call
tools in loops.

``DEMO_TOKENIZER`` has the ``encode``/``decode`` pair of a Hugging Face tokenizer (what the
adapters' previews call). Its vocabulary is every word and mark of the texts below, in a fixed
order, so ids are the same on every machine and the workload's text round-trips exactly.
"""

from __future__ import annotations

import random
import re

SPECIAL = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool_call|>", "<|tool_result|>", "<|end|>", "<unk>")

SYSTEM_PROMPTS = (
    "You are Ada, the support assistant of Northwind Cloud. Answer questions about accounts, "
    "billing, storage buckets and compute instances. Be brief and exact. Never share a customer's "
    "data with another customer. If you do not know, say so and offer to open a ticket. Prices are "
    "in US dollars per month. Refunds over 100 dollars need a human agent.",
    "You are a coding agent working in a Python repository. You can call these tools: search(query) "
    "finds code, read_file(path) shows a file, run_tests(path) runs the tests, and edit(path, patch) "
    "changes a file. Read before you edit. Run the tests after every change. Stop when the tests "
    "pass and explain what you changed in two sentences.",
    "You are a careful research assistant. Cite the documents you are given by their number, such "
    "as [2]. Do not invent sources. When the documents disagree, say which ones disagree and why. "
    "Answer in plain English for a reader who is not an expert, in at most three short paragraphs.",
    "You are a friendly tutor for students learning statistics. Explain one idea at a time, check "
    "the student's understanding with a short question, and use small numeric examples. Do not give "
    "the final answer to homework; guide the student to it step by step.",
)

USER_TURNS = (
    ("how do I resize a storage bucket without losing data?", "my invoice for March is 40 dollars "
     "higher than February, why?", "can you move my instance to the Frankfurt region?",
     "I was charged twice for the same month, please refund one charge.",
     "what happens to my snapshots if I close the account?"),
    ("the test test_parse_dates fails on leap years, fix it.", "add a timeout option to the "
     "download function.", "why is the cache module so slow on large inputs?",
     "rename the config loader and update every caller.", "the CI says an import is unused, clean it up."),
    ("summarize what the documents say about sleep and memory.", "do documents 1 and 3 agree on the "
     "effect of coffee?", "which document is the most recent, and what does it add?",
     "explain the main result of document 2 for a high school student."),
    ("what is a p value, in simple words?", "why do we divide by n minus 1 for the sample variance?",
     "I got a correlation of 0.9, does that mean one causes the other?",
     "how is the median different from the mean when there are outliers?"),
)

ASSISTANT_TURNS = (
    "Sure. Here is what to do, step by step. First, open the console and check the settings. "
    "Then confirm the change. It takes about five minutes and nothing is lost.",
    "Good question. The short answer is that it depends on the size of the data. In your case the "
    "numbers above explain the difference, and I can open a ticket if you want a human to check.",
    "I looked at this carefully. The cause is a small mistake in how the values are counted. "
    "I changed one line and the result is now correct for every case I tried.",
    "Let me explain with a small example. Take the numbers 2, 4 and 9. The mean is 5 and the "
    "median is 4. Now, what do you think happens if we replace 9 with 90?",
)

TOOL_LOOPS = (
    ("search(\"parse_dates\")", "src/dates.py line 42: def parse_dates(text):"),
    ("read_file(\"src/dates.py\")", "def parse_dates(text): days = 365 if year % 4 else 366 return days"),
    ("edit(\"src/dates.py\", patch)", "ok, 1 file changed, 2 lines"),
    ("run_tests(\"tests/test_dates.py\")", "12 passed in 0.4 seconds"),
    ("search(\"timeout\")", "src/download.py line 10: def download(url):"),
    ("run_tests(\"tests\")", "1 failed, 40 passed: test_cache_large takes 9 seconds"),
)

# A token is a word, number or mark with the space before it (as GPT-style vocabularies keep
# it), or a line break: decode is a plain join, and text round-trips exactly.
_WORD = re.compile(r"\n| ?(?:<\|[a-z_]+\|>|<unk>|[A-Za-z_][\w./]*\w|[A-Za-z]|\d+(?:\.\d+)?|[^\sA-Za-z\d])")


def _words(text: str) -> list[str]:
    return _WORD.findall(text)


def _vocabulary() -> list[str]:
    texts = [*SYSTEM_PROMPTS, *(t for group in USER_TURNS for t in group), *ASSISTANT_TURNS,
             *(part for loop in TOOL_LOOPS for part in loop), " ".join(SPECIAL)]
    seen: dict[str, None] = {}
    for text in texts:
        for word in _words(" " + text):
            seen.setdefault(word, None)
            seen.setdefault(word.lstrip(" "), None)
    return [*SPECIAL, "\n", *sorted(w for w in seen if w not in SPECIAL and w != "\n")]


class DemoTokenizer:
    """Words, numbers and marks (each with the space before it) to ids and back; an unknown
    word is ``<unk>``."""

    def __init__(self, vocabulary: list[str]) -> None:
        self.vocabulary = vocabulary
        self.ids = {w: i for i, w in enumerate(vocabulary)}
        self.unknown = self.ids["<unk>"]

    @property
    def vocab_size(self) -> int:
        return len(self.vocabulary)

    def encode(self, text: str) -> list[int]:
        return [self.ids.get(w, self.ids.get(w.lstrip(" "), self.unknown)) for w in _words(text)]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.vocabulary[i] if 0 <= i < len(self.vocabulary) else "<unk>" for i in ids)


DEMO_TOKENIZER = DemoTokenizer(_vocabulary())


class DemoConversations:
    """The token ids of the demo's text: system prompts, and each session's next user turn and
    reply. A session keeps to one of the four kinds (by its system prompt); the coding agent's
    turns are tool loops."""

    def __init__(self, rng: random.Random, tokenizer: DemoTokenizer = DEMO_TOKENIZER) -> None:
        self.rng = rng
        self.tokenizer = tokenizer
        self.system_prompts = [tokenizer.encode(f"<|system|> {p}<|end|>\n") for p in SYSTEM_PROMPTS]

    def user_turn(self, kind: int) -> list[int]:
        text = self.rng.choice(USER_TURNS[kind % len(USER_TURNS)])
        return self.tokenizer.encode(f"<|user|> {text}<|end|>\n<|assistant|>")

    def reply(self, kind: int) -> list[int]:
        if kind % len(USER_TURNS) == 1:  # the coding agent: a loop of tool calls, then a word
            calls = self.rng.sample(TOOL_LOOPS, self.rng.randint(1, 3))
            parts = [f"<|tool_call|> {call}\n<|tool_result|> {result}\n" for call, result in calls]
            return self.tokenizer.encode(" " + "".join(parts) + self.rng.choice(ASSISTANT_TURNS) + "<|end|>\n")
        return self.tokenizer.encode(f" {self.rng.choice(ASSISTANT_TURNS)}<|end|>\n")
