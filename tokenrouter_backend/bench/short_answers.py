"""The short-answer workload: chat questions a model answers in a sentence (at most ~32 tokens),
alone and after a long retrieved context.

Short answers are where a router's fixed costs show: a light prefill, a session opened and
closed, an ending vouched for — all paid for a dozen tokens. ``short_answer_prompts`` renders
each question through the model's own chat template (the exported tokenizer's), as the OpenAI
front would, so the server sees what a chat client sends. ``short`` questions stand alone;
``short_rag`` ones follow about ``context_tokens`` tokens of retrieved standard-library
source (``traffic.rag_prompt``'s text) and ask about it. Every prompt is distinct, and a
``nonce`` line in the system message keeps one arm's prompts out of another's caches
(``arm_prompts``).
"""
from __future__ import annotations

from typing import Callable

from .workloads import Prompt

SHORT = "short"
SHORT_RAG = "short_rag"
SYSTEM = "You are a helpful assistant. Answer in one short sentence."
QUESTIONS = (
    "What is the capital of Australia?",
    "How many bits are in a byte?",
    "What does the HTTP status code 404 mean?",
    "Which planet is closest to the sun?",
    "What is the boiling point of water at sea level in Celsius?",
    "What does CPU stand for?",
    "Who wrote the play Romeo and Juliet?",
    "What is the chemical symbol for gold?",
    "What is 12 times 12?",
    "Which language is used to style web pages?",
    "What port does HTTPS use by default?",
    "What is the largest ocean on Earth?",
    "What does the Python keyword `yield` do?",
    "How many minutes are in a day?",
    "What is the opposite of the word 'ancient'?",
    "Which data structure works first in, first out?",
)
RAG_QUESTIONS = (
    "Which module is the first retrieved file above?",
    "Name one function defined in the code above.",
    "Is the code above written in Python or in C?",
    "What does the first retrieved file's docstring say the module is for?",
    "Does the code above import any other module? Name one.",
    "How many retrieved files does the context above begin with: one or several?",
    "Name one class defined in the code above, if any.",
    "What character starts every comment line in the code above?",
)
DEFAULT_CONTEXT_TOKENS = 800


def messages(question: str, context: str = "", nonce: str = "") -> list[dict[str, str]]:
    system = f"[{nonce}] {SYSTEM}" if nonce else SYSTEM
    user = f"{context}\n\n{question}" if context else question
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def short_answer_prompts(render: Callable[[list[dict]], str], context_tokens: int = DEFAULT_CONTEXT_TOKENS,
                         nonce: str = "", tokenizer=None, rag: bool = True) -> list[Prompt]:
    """The workload's prompts, rendered by ``render`` (a chat template: messages -> prompt
    text). ``tokenizer`` (a ``tokenizers.Tokenizer``) sizes the retrieved contexts in tokens."""
    from .traffic import rag_prompt

    out = [Prompt(f"short-{i:02d}", SHORT, render(messages(q, nonce=nonce))) for i, q in enumerate(QUESTIONS)]
    if rag and context_tokens > 0:
        for i, q in enumerate(RAG_QUESTIONS):
            context = rag_prompt(context_tokens, offset=i, tokenizer=tokenizer).rsplit("\n\n# Question:", 1)[0]
            out.append(Prompt(f"short-rag-{i:02d}", SHORT_RAG, render(messages(q, context, nonce))))
    return out

