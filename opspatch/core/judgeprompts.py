"""The prompt set the judge decodes when a playbook's `[judge]` names no file (pure data).

Short, plain prompts of several kinds (facts, stories, code, lists), so that greedy outputs and
speculative acceptance vary from prompt to prompt as they do on a real workload. A playbook's
`prompts = "FILE"` replaces them (one prompt a line).
"""

from __future__ import annotations

DEFAULT_JUDGE_PROMPTS = (
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The quick brown fox",
    "Water boils at a temperature of",
    "A good way to learn a new language is",
    "The three primary colors are",
    "In the morning, the baker",
    "for i in range(10):",
    "The largest planet in the solar system is",
    "My favourite book is about",
    "To make a cup of tea, first",
    "The river flows through the",
    "SELECT name FROM users WHERE",
    "The history of the printing press",
    "She opened the door and saw",
    "The speed of light is about",
    "A list of fruits: apples, bananas,",
    "The meeting was moved to",
    "import json\n",
    "The weather today is",
    "He wrote a letter to his",
    "The most important rule of the road is",
    "Dear team, thank you for",
    "The cat sat on the",
    "An engine needs fuel because",
    "The mountains in winter are",
    "If the server does not answer,",
    "The first step of any recipe is",
    "The train to the city leaves at",
    "class Stack:\n",
    "The answer to the question is",
)
