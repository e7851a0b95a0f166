"""The chat template: the exported tokenizer's own (``preprocessing/1/tokenizer``), applied
with transformers' ``apply_chat_template`` (the standard implementation), or a Jinja file
given with ``--chat-template``. A tokenizer without one makes ``/v1/chat/completions``
answer 400 naming the missing template (``/v1/completions`` still works).

``render_with_spans`` also says where the messages' contents are in the prompt (character
ranges, for ``preprocessing``'s ``content_spans``: special-token text there stays text). It
renders the messages once more with a marker standing for each content and fills the
contents back in; when that is not the real render (a template that reads what the contents
say), the spans are unknown and a content holding special-token text is refused."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

from .errors import OpenAIError

TOKENIZER_DIR = Path("preprocessing") / "1" / "tokenizer"  # inside the model repository
MARK = "\ue000tokenrouter-content-{}\ue001"  # stands for message i's content in a skeleton render
MARKS = re.compile("\ue000tokenrouter-content-(\\d+)\ue001")


class ChatTemplate:
    def __init__(self, tokenizer_dir: Path, template_file: Optional[Path] = None):
        from transformers import AutoTokenizer

        self.tokenizer_dir = Path(tokenizer_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.tokenizer_dir))
        self.override = Path(template_file).read_text() if template_file else None

    @property
    def available(self) -> bool:
        return bool(self.override or getattr(self.tokenizer, "chat_template", None))

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages``, ending with the assistant turn's opening (unless
        ``add_generation_prompt`` is false: ``/tokenize`` may ask so)."""
        if not self.available:
            raise OpenAIError(
                f"this model has no chat template: the exported tokenizer ({TOKENIZER_DIR}) has none; "
                "start the front with --chat-template FILE, or use /v1/completions",
                param="messages", code="chat_template_missing")
        from jinja2 import TemplateError

        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      chat_template=self.override)
        except TemplateError as exc:
            raise OpenAIError(f"the chat template refused these messages: {exc}", param="messages") from exc

    def render_with_spans(self, messages: list[dict[str, str]],
                          add_generation_prompt: bool = True) -> tuple[str, Optional[list[int]]]:
        """The prompt and its contents' character ranges (flat start, end pairs); None when the
        template does not place contents verbatim and no content holds special-token text."""
        text = self.render(messages, add_generation_prompt)
        marked = [dict(m, content=MARK.format(i)) if isinstance(m.get("content"), str) else m
                  for i, m in enumerate(messages)]
        try:
            skeleton = self.render(marked, add_generation_prompt)
        except OpenAIError:
            skeleton = ""
        parts, spans, at = [], [], 0
        for found in MARKS.finditer(skeleton):
            parts.append(skeleton[at:found.start()])
            start = sum(len(p) for p in parts)
            content = messages[int(found.group(1))]["content"]
            parts.append(content)
            spans += [start, start + len(content)]
            at = found.end()
        parts.append(skeleton[at:])
        if "".join(parts) == text:
            return text, spans
        special = self.special_text_in(messages)
        if special:
            raise OpenAIError(f"a message holds the special token {special!r}, and this chat template does not "
                              "place message contents verbatim, so it cannot be kept as text; remove it (or "
                              "start the front with --chat-special-tokens)", param="messages",
                              code="special_token_in_content")
        return text, None

    def special_text_in(self, messages: list[dict[str, str]]) -> Optional[str]:
        """The first special token whose text appears in a message's content, or None."""
        specials = [t.content for t in self.tokenizer.added_tokens_decoder.values() if t.special and t.content]
        for m in messages:
            content = m.get("content")
            if isinstance(content, str):
                for s in specials:
                    if s in content:
                        return s
        return None
