"""The demo's task: advice prompts, responses of five qualities, and a gold judge standing in for human raters.

Modelled on the classic RLHF example (InstructGPT / "learning to summarize"): people ask for advice, a model answers,
raters compare two answers. Here the raters are a transparent rule, so every result can be checked against the truth:

- **prompts** — topics × question forms × openings, e.g. ``"Q: any tips for better sleep?\\nA:"``.
- **responses** by quality class (`QUALITIES`): helpful (on-topic tips, polite, the right length, a proper
  ending), vague (polite but says nothing), off_topic (tips for another topic), rude (insults), rambling
  (fillers, far too long, never finishes).
- **the gold judge** `gold_score` — the sum of five visible terms (`gold_terms`); `gold` is the judge as a reward
  function. The reward model never sees it: it learns only from the rankings `gold_ranking` draws (Plackett–Luce
  noise) or the pairs `gold_label` labels (Bradley–Terry noise), like a human rater.

Pure Python (no torch): cheap to import from the reward loader and from tests."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Sequence
from typing import Any, Literal

Quality = Literal["helpful", "vague", "rambling", "off_topic", "rude"]
QUALITIES: tuple[Quality, ...] = ("helpful", "vague", "rambling", "off_topic", "rude")
"""The response classes, best first (by the gold judge's mean score; a test checks the order)."""

# Topic phrase (as it appears in the prompt): the words an on-topic answer uses.
_TOPIC_WORDS = """
sleep: bed night dark routine
exercise: walk muscles stretch gym
cooking: recipe vegetables oven salt
saving money: budget spending savings bills
studying: notes exam review focus
gardening: soil seeds water plants
travel: ticket luggage map hotel
stress: breathe calm break relax
writing: draft words edit story
learning guitar: chords strings practice songs
making friends: club talk smile invite
job interviews: resume questions company prepare
"""
TOPICS: dict[str, tuple[str, ...]] = {
    topic: tuple(words.split()) for topic, words in (line.split(": ") for line in _TOPIC_WORDS.strip().splitlines())
}
QUESTION_FORMS = (
    "how can I get better at {topic}?",
    "any tips for {topic}?",
    "what should I know about {topic}?",
    "I need advice on {topic}.",
    "what is a good way to start with {topic}?",
)
OPENINGS = ("", "hi, ", "please help: ", "quick question: ")
PROMPT_TEMPLATE = "Q: {question}\nA:"
"""How a question is put to the model; responses start with a space after ``A:``."""

TIP_FORMS = (
    "try a simple {a} and keep the {b} in mind",
    "start with the {a} and check the {b} each day",
    "plan your {a} first, then your {b}",
    "a steady {a} helps, and so does the {b}",
)
POLITE_OPENERS = ("", "good question. ", "happy to help. ", "sure. ")
POLITE_CLOSERS = ("good luck!", "hope this helps.", "you can do it!")
VAGUE = (
    "it depends on a lot of things, so just see what works for you.",
    "there are many ways to do it, and everyone is different.",
    "just keep going and things will work out in the end.",
    "do what feels right, it is up to you really.",
)
RUDE = (
    "that is a stupid question, figure it out yourself.",
    "nobody cares, stop asking dumb things, idiot.",
    "ugh, what a boring question. go away.",
    "are you serious? that is dumb, just shut up.",
)
RUDE_WORDS = frozenset({"stupid", "dumb", "idiot", "shut", "ugh", "nobody", "boring"})
POLITE_WORDS = frozenset({"luck", "hope", "helps", "help", "please", "happy"})
FILLERS = ("well", "um", "so", "like", "you know", "I mean", "anyway", "basically")

TARGET_WORDS = 14
"""Length (in words) the gold judge likes best; helpful answers are written near it."""
BT_TEMPERATURE = 0.5
"""Rater noise: P(a preferred over b) = σ((gold(a) − gold(b)) / BT_TEMPERATURE)."""

_WORD = re.compile(r"[a-z']+")
_KEYWORD_TOPIC = {word: topic for topic, words in TOPICS.items() for word in words}


# Prompts and responses
def prompts() -> list[str]:
    """Every prompt of the task, in a fixed order: len(TOPICS)·len(QUESTION_FORMS)·len(OPENINGS) = 240."""
    return [
        PROMPT_TEMPLATE.format(question=opening + form.format(topic=topic))
        for topic in TOPICS
        for form in QUESTION_FORMS
        for opening in OPENINGS
    ]


def split_prompts(seed: int, eval_fraction: float = 0.2) -> tuple[list[str], list[str]]:
    """(train, held-out) prompts: a seeded shuffle, the last `eval_fraction` held out."""
    shuffled = prompts()
    random.Random(seed).shuffle(shuffled)
    n_eval = max(1, round(len(shuffled) * eval_fraction))
    return shuffled[:-n_eval], shuffled[-n_eval:]


def topic_of(prompt: str) -> str | None:
    """The topic a prompt asks about (the first topic phrase in it), or None."""
    return next((topic for topic in TOPICS if topic in prompt.lower()), None)


def _tip(rng: random.Random, topic: str) -> str:
    a, b = rng.sample(list(TOPICS[topic]), 2)
    return rng.choice(TIP_FORMS).format(a=a, b=b)


def response(prompt: str, quality: Quality, rng: random.Random) -> str:
    """One response of class `quality` to `prompt` (with a leading space, as it follows ``A:``)."""
    topic = topic_of(prompt) or rng.choice(list(TOPICS))
    if quality == "helpful":
        text = f"{rng.choice(POLITE_OPENERS)}{_tip(rng, topic)}. {rng.choice(POLITE_CLOSERS)}"
    elif quality == "vague":
        text = rng.choice(VAGUE)
    elif quality == "off_topic":
        other = rng.choice([t for t in TOPICS if t != topic])
        text = f"{_tip(rng, other)}. {_tip(rng, other)}."
    elif quality == "rude":
        text = rng.choice(RUDE)
    elif quality == "rambling":
        words = [rng.choice(FILLERS) for _ in range(rng.randint(14, 22))]
        words.insert(rng.randrange(len(words)), rng.choice(TOPICS[topic]))
        text = ", ".join(words)  # no closing punctuation: a ramble never finishes
    else:
        raise ValueError(f"unknown quality {quality!r}; expected one of {', '.join(QUALITIES)}")
    return " " + text


def demonstrations(
    prompts_: Sequence[str], mix: dict[Quality, float], n: int, rng: random.Random
) -> list[dict[str, Any]]:
    """`n` rows {prompt, response, quality}: prompts drawn uniformly, qualities drawn with weights `mix`."""
    qualities, weights = list(mix), list(mix.values())
    rows = []
    for _ in range(n):
        prompt = rng.choice(list(prompts_))
        quality = rng.choices(qualities, weights)[0]
        rows.append({"prompt": prompt, "response": response(prompt, quality, rng), "quality": quality})
    return rows


# The gold judge
def gold_terms(prompt: str, response_: str) -> dict[str, float]:
    """The five terms of `gold_score`, by name (for reading why a response scored what it did)."""
    words = _WORD.findall(response_.lower())
    distinct = set(words)
    topic = topic_of(prompt)
    on_topic = {w for w in distinct if _KEYWORD_TOPIC.get(w) == topic}
    off_topic = {w for w in distinct if w in _KEYWORD_TOPIC and _KEYWORD_TOPIC[w] != topic}
    return {
        # relevance: +1 per distinct on-topic keyword (at most 2), −0.5 per keyword of another topic (at most 2)
        "relevance": min(len(on_topic), 2) - 0.5 * min(len(off_topic), 4),
        # politeness: +0.5 for a courteous word, −1.5 per distinct rude word (at most 3)
        "politeness": 0.5 * bool(distinct & POLITE_WORDS) - 1.5 * min(len(distinct & RUDE_WORDS), 3),
        # length: −0.1 per word away from the target, at most −2
        "length": -min(0.1 * abs(len(words) - TARGET_WORDS), 2.0),
        # repetition: −1 for a response that is all repeats (1 − distinct/total words)
        "repetition": -(1 - len(distinct) / len(words)) if words else -1.0,
        # ending: +0.5 when the response ends a sentence
        "ending": 0.5 if response_.rstrip().endswith((".", "!", "?")) else 0.0,
    }


def gold_score(prompt: str, response_: str) -> float:
    """The gold judge: the sum of `gold_terms` (relevance, politeness, length, repetition, ending). Roughly in
    [−7, 3]; a helpful answer near the target length scores about 2.5–3."""
    return sum(gold_terms(prompt, response_).values())


def preference_probability(score_a: float, score_b: float) -> float:
    """Bradley–Terry: P(a preferred over b) = σ((score_a − score_b) / BT_TEMPERATURE)."""
    return 1.0 / (1.0 + math.exp(-(score_a - score_b) / BT_TEMPERATURE))


def gold_label(pair: tuple[str, str, str], rng: random.Random) -> dict[str, Any]:
    """A rater's label of `pair` = (prompt, a, b): {prompt, chosen, rejected, gold_margin}, a chosen with probability
    σ((gold(a) − gold(b)) / BT_TEMPERATURE): close pairs almost at random, clear ones almost always right.
    ``gold_margin`` (negative when the noise flipped the label) is for analysis only: `rlhf rm` reads "margin"."""
    prompt, a, b = pair
    score_a, score_b = gold_score(prompt, a), gold_score(prompt, b)
    a_wins = rng.random() < preference_probability(score_a, score_b)
    chosen, rejected = (a, b) if a_wins else (b, a)
    margin = score_a - score_b if a_wins else score_b - score_a
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected, "gold_margin": margin}


def gold_ranking(prompt: str, completions: Sequence[str], rng: random.Random) -> dict[str, Any]:
    """A rater's ranking of a prompt's distinct answers, ``{prompt, completions, ranking}`` (best first): Plackett–Luce
    at `BT_TEMPERATURE`, the rater picks the best of the answers left with probability ∝ exp(gold / T), then the next.
    For two answers that is `gold_label`'s Bradley–Terry draw; the ranking's implied pairs are never intransitive.
    Empty and repeated answers are left out (a rater sees one copy of each text)."""
    answers = list(dict.fromkeys(c for c in completions if c.strip()))
    weights = [math.exp(gold_score(prompt, a) / BT_TEMPERATURE) for a in answers]
    left, ranking = list(range(len(answers))), []
    while left:
        # one draw per place: the first index whose running sum of weights passes u · (the weights left)
        u, running = rng.random() * sum(weights[i] for i in left), 0.0
        pick = next((i for i in left if (running := running + weights[i]) > u), left[-1])
        ranking.append(pick)
        left.remove(pick)
    return {"prompt": prompt, "completions": answers, "ranking": ranking}


def gold(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
    """The gold judge as a reward function (``rlhf.demo.task:gold``, for ``rlhf eval --judge`` or as a trainer's
    reward): one `gold_score` per completion."""
    return [gold_score(p, c) for p, c in zip(prompts, completions, strict=True)]
