"""The chat template: the exported tokenizer's own (``preprocessing/1/tokenizer``), applied
with transformers' ``apply_chat_template`` (the standard implementation), or a Jinja file
given with ``--chat-template``. A tokenizer without one makes ``/v1/chat/completions``
answer 400 naming the missing template (``/v1/completions`` still works)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from .errors import OpenAIError

TOKENIZER_DIR = Path("preprocessing") / "1" / "tokenizer"  # inside the model repository


class ChatTemplate:
    def __init__(self, tokenizer_dir: Path, template_file: Optional[Path] = None):
        from transformers import AutoTokenizer

        self.tokenizer_dir = Path(tokenizer_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer_dir))
        self.override = Path(template_file).read_text() if template_file else None

    @property
    def available(self) -> bool:
        return bool(self.override or getattr(self.tokenizer, "chat_template", None))

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for ``messages``, ending with the assistant turn's opening."""
        if not self.available:
            raise OpenAIError(
                f"this model has no chat template: the exported tokenizer ({TOKENIZER_DIR}) has none; "
                "start the front with --chat-template FILE, or use /v1/completions",
                param="messages", code="chat_template_missing")
        from jinja2 import TemplateError

        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                                      chat_template=self.override)
        except TemplateError as exc:
            raise OpenAIError(f"the chat template refused these messages: {exc}", param="messages") from exc
