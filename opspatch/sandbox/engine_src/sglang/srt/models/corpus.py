"""The text the stand-in's language models are counted from, written for this project.

A few kilobytes of plain English (and a little Python) in separate documents: the target and the
draft model are character n-gram models built from it at start, so greedy decoding continues a
prompt with words and sentences a reader recognises. Changing this text changes every greedy
output of the stand-in (tests compare outputs with each other, never with fixed strings, except
for the opening of a few well-known prompts).
"""

from __future__ import annotations

DOCUMENTS: tuple[str, ...] = (
    "The capital of France is Paris. Paris is a large city on the river Seine, and it is known "
    "for its museums, its bridges and its cafes. The capital of Germany is Berlin, the capital of "
    "Italy is Rome, and the capital of Spain is Madrid. The capital of Japan is Tokyo, a city of "
    "many millions of people. The capital of England is London, which stands on the river Thames.",
    "The capital city of France is Paris, and it has been the seat of the government for a very "
    "long time. Many people visit the city every year to see the old buildings and the gardens.",
    "Once upon a time there was a small village at the edge of a great forest. The people of the "
    "village were farmers, and every morning they went out to work in the fields. One day a young "
    "girl found a path that led into the forest. She followed it for a long time, until she came "
    "to a house made of stone. An old man lived there, and he told her stories about the world "
    "beyond the hills. When the sun went down she walked back to the village, and she never "
    "forgot what the old man had told her.",
    "Hello, and welcome to the server. This is a small model that runs on the processor of any "
    "machine. It reads the text you give it one character at a time, and it writes the most "
    "likely next character, again and again, until it has written as many as you asked for.",
    "The quick brown fox jumps over the lazy dog. The dog does not move, and the fox runs away "
    "into the forest before the farmer comes back from the fields.",
    "Water boils at one hundred degrees at sea level, and it freezes at zero. The sun is a star, "
    "and the earth goes around it once every year. The moon goes around the earth about once "
    "every month, and the light of the moon is the light of the sun.",
    "A good engineer reads the error message first. When a server crashes on its first request, "
    "the log shows where the program stopped, and the fix is often a single line. A careful team "
    "tests the fix on one machine before it changes every machine in the fleet, and it keeps a "
    "record of what was changed, where and when, so that the change can be undone.",
    "What is the capital of France? The capital of France is Paris. What is the largest ocean? "
    "The largest ocean is the Pacific Ocean. What is the tallest mountain? The tallest mountain "
    "is Mount Everest.",
    "Speculative decoding makes a language model faster without changing what it writes. A small "
    "draft model guesses the next few tokens, and the large target model checks all of them in "
    "one step. The target keeps the guesses that agree with its own choice and writes its own "
    "token where they differ, so the text is the same as the target would write alone.",
    "The history of the city begins with a small settlement on an island in the river. Over many "
    "centuries the settlement grew into a town, and the town into a city, with walls, markets and "
    "churches. Today the old walls are gone, but the streets still follow their line.",
    "def fibonacci(n):\n    if n < 2:\n        return n\n"
    "    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "def square(x):\n    return x * x\n",
    "def factorial(n):\n    result = 1\n    for i in range(2, n + 1):\n"
    "        result = result * i\n    return result\n",
    "In the morning the market opens early. The farmers bring bread, cheese, apples and fresh "
    "vegetables from the country, and the people of the town come to buy what they need for the "
    "day. By noon the market is quiet again, and the streets are empty until the evening.",
    "The train leaves the station at nine in the morning and arrives in the city before noon. "
    "From the window you can see the fields, the rivers and the small villages of the country, "
    "and at the end of the journey the towers of the city appear on the horizon.",
)
