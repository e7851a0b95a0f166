"""OpenAI request bodies: what is accepted, what is refused by name, and the ensemble knobs.

The OpenAI fields TokenRouter implements map onto the ensemble's inputs; the router knobs
(``router_mode``, ``confidence_threshold``, ...) are accepted as extra body fields. Fields
TokenRouter cannot honour (``n`` > 1, tools, ...) are refused with an
error naming them rather than silently ignored; a few that change nothing about the answer
(``user``, ``metadata``, ``store``, ...) are accepted and ignored. Any other field is refused.

A completion's ``prompt`` is one or several prompts, as OpenAI and vLLM take it: a string, a
list of strings, a list of token ids (one prompt) or a list of lists of token ids
(``CompletionBody.prompts``). ``TokenizeCompletionBody``, ``TokenizeChatBody`` and
``DetokenizeBody`` are vLLM's ``/tokenize`` and ``/detokenize`` bodies.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, Strict

from tokenrouter_backend.core.protocol.cache_salt import CACHE_SALT, parse_cache_salt
from tokenrouter_backend.core.protocol.params import MIN_TEMPERATURE, InvalidRequest

from .errors import OpenAIError

MAX_STOP = 4  # OpenAI's limit on `stop` strings
MAX_CHOICES = 16  # n and best_of: generations of one prompt
MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries
PROCESSOR_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens", "ignore_eos",
                    "stop_token_ids")
MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's range of chat top_logprobs
MAX_COMPLETION_LOGPROBS = 5  # and of completions' logprobs
SEED_MAX = (1 << 64) - 1  # random_seed is a UINT64 input
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1  # the ensemble's integer inputs are INT32
# integers are JSON integers (no bool, float or string) within the range of the input that
# carries them, so nothing wraps on the way; the router's own ranges (max_tokens_limit, ...) apply after
Int32 = Annotated[int, Strict(), Field(ge=INT32_MIN, le=INT32_MAX)]
Count = Annotated[int, Strict(), Field(ge=1, le=INT32_MAX)]
Length = Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]  # completions' max_tokens: 0 scores the prompt
Seed = Annotated[int, Strict(), Field(ge=0, le=SEED_MAX)]
# a token id as JSON carries it: an integer within INT32 (the vocabulary's bound is preprocessing's)
TOKEN_ID_RANGE = f"an integer in [0, {INT32_MAX}]"
Prompt = Union[str, list[int]]  # one prompt: its text, or its token ids (which skip the tokenizer)
IGNORED_FIELDS = frozenset({"user", "metadata", "store", "service_tier", "parallel_tool_calls",
                            "prompt_cache_key", "safety_identifier"})


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class RouterKnobs(BaseModel):
    """The ensemble's router knobs as extra body fields (docs/configuration.md has their defaults)."""

    model_config = ConfigDict(extra="allow")

    router_mode: Optional[str] = None
    block_size: Optional[Int32] = None
    block_schedule: Optional[str] = None
    confidence_threshold: Optional[float] = None
    entropy_threshold: Optional[float] = None
    rollback_threshold: Optional[float] = None
    rollback_window: Optional[Int32] = None
    draft_confidence_threshold: Optional[float] = None
    top_k: Optional[Int32] = None
    min_p: Optional[float] = Field(default=None, ge=0.0, le=1.0)  # vLLM's field
    decision_log: Optional[bool] = None
    dynamic_threshold_quantile: Optional[float] = None
    allow_degradation: Optional[bool] = None
    ngram_drafts: Optional[bool] = None
    light_copies: Optional[bool] = None
    light_kv_window: Optional[Int32] = None
    answer_cache: Optional[bool] = None
    learned_router: Optional[bool] = None
    router_threshold: Optional[float] = None


ROUTER_KNOBS = tuple(RouterKnobs.model_fields)


class GenerationBody(RouterKnobs):
    """Fields common to both endpoints."""

    model: str
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    max_tokens: Optional[Count] = None
    temperature: Optional[float] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[float] = Field(default=None, gt=0.0, le=1.0)
    seed: Optional[Seed] = None
    stop: Union[str, list[str], None] = None
    n: Optional[Count] = None
    presence_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: Optional[float] = Field(default=None, ge=-2.0, le=2.0)
    logit_bias: Optional[dict[str, Any]] = None  # token id (as a string) -> -100 .. 100
    # vLLM's extra sampling fields (the router's logit processors)
    repetition_penalty: Optional[float] = Field(default=None, ge=0.01, le=10.0)
    min_tokens: Optional[Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]] = None
    ignore_eos: Optional[bool] = None
    stop_token_ids: Optional[list[Annotated[int, Strict(), Field(ge=0, le=INT32_MAX)]]] = Field(default=None,
                                                                                                max_length=64)
    # vLLM's field: requests of different salts share no cached answer or KV prefix block
    cache_salt: Optional[str] = None

    def check(self) -> None:
        """Refuse what is well-formed but not supported, and unknown fields, by name."""
        unknown = sorted(set(self.model_extra or {}) - IGNORED_FIELDS)
        if unknown:
            raise OpenAIError(f"unrecognized request argument(s): {', '.join(unknown)}", param=unknown[0])
        if self.n is not None and self.n > MAX_CHOICES:
            raise OpenAIError(f"n must be in [1, {MAX_CHOICES}]; got {self.n}", param="n")
        if self.temperature is not None and 0.0 < self.temperature < MIN_TEMPERATURE:  # NaN probabilities below
            raise OpenAIError(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, 2]; got {self.temperature}",
                              param="temperature")
        self.bias()
        if self.stream_options is not None and not self.stream:
            raise OpenAIError("stream_options is only allowed with stream: true", param="stream_options")
        stops = self.stop_words()
        if len(stops) > MAX_STOP:
            raise OpenAIError(f"stop has {len(stops)} entries; at most {MAX_STOP} allowed", param="stop")
        if any(not s for s in stops):
            raise OpenAIError("stop strings must be non-empty", param="stop")
        self.check_cache_salt()

    def check_cache_salt(self) -> None:
        """Non-empty when given (as vLLM), UTF-8, at most ``MAX_CACHE_SALT_BYTES`` bytes."""
        if self.cache_salt is None:
            return
        if not self.cache_salt:
            raise OpenAIError(f"{CACHE_SALT} must be a non-empty string when given", param=CACHE_SALT)
        try:
            parse_cache_salt(self.cache_salt)
        except InvalidRequest as exc:
            raise OpenAIError(str(exc), param=CACHE_SALT) from None

    def stop_words(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def answer_tokens(self) -> Optional[int]:
        return self.max_tokens

    def logprob_count(self) -> int:
        """-1: no log-probabilities asked; k >= 0: the tokens' and k alternatives each."""
        return -1

    def choices(self) -> int:
        """``n``: the choices returned per prompt."""
        return self.n or 1

    def candidates(self) -> int:
        """The generations per prompt (``best_of`` for completions, else ``n``)."""
        return self.choices()

    def seed_of(self, candidate: int) -> Optional[int]:
        """Generation ``candidate``'s seed: the request's seed (0 when absent) plus its index,
        so a seeded request repeats choice for choice; None for the first of an unseeded one
        (the router's default)."""
        if candidate == 0:
            return self.seed
        return ((self.seed or 0) + candidate) % (SEED_MAX + 1)

    def bias(self) -> dict[int, float]:
        """``logit_bias`` as token id -> bias: keys are token ids as strings (OpenAI's form),
        values numbers in [-100, 100], at most 300 entries."""
        if not self.logit_bias:
            return {}
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            raise OpenAIError(f"logit_bias has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS} allowed",
                              param="logit_bias")
        out = {}
        for key, value in self.logit_bias.items():
            if not key.isdigit() or int(key) > INT32_MAX:
                raise OpenAIError(f"logit_bias keys must be token ids; got {key!r}", param="logit_bias")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -100 <= value <= 100:
                raise OpenAIError(f"logit_bias values must be numbers in [-100, 100]; got {value!r}",
                                  param="logit_bias")
            out[int(key)] = float(value)
        return out

    def knobs(self) -> dict[str, Any]:
        """The ensemble's optional inputs for this request (absent fields stay server defaults)."""
        knobs: dict[str, Any] = {name: getattr(self, name) for name in ROUTER_KNOBS}
        knobs.update({name: getattr(self, name) or None if name == "stop_token_ids" else getattr(self, name)
                      for name in PROCESSOR_FIELDS}, logit_bias=self.bias() or None)
        knobs.update(max_tokens=self.answer_tokens(), temperature=self.temperature, top_p=self.top_p,
                     random_seed=self.seed, stop_words=self.stop_words() or None, cache_salt=self.cache_salt)
        if self.logprob_count() >= 0:
            knobs.update(return_log_probs=True, top_log_probs=self.logprob_count())
        return {k: v for k, v in knobs.items() if v is not None}

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class CompletionBody(GenerationBody):
    prompt: Union[str, list[Any]]  # the shapes are checked by ``prompts`` (pydantic's union errors name none)
    echo: bool = False
    suffix: Optional[str] = None
    best_of: Optional[Count] = None
    logprobs: Optional[Int32] = None
    max_tokens: Optional[Length] = None

    def check(self) -> None:
        super().check()
        if self.suffix:
            raise OpenAIError("suffix is not supported", param="suffix")
        if self.best_of is not None:
            if not self.choices() <= self.best_of <= MAX_CHOICES:
                raise OpenAIError(f"best_of must be in [n, {MAX_CHOICES}] (n = {self.choices()}); got {self.best_of}",
                                  param="best_of")
            if self.stream and self.best_of > self.choices():
                raise OpenAIError("best_of greater than n cannot be streamed (the best are known at the end)",
                                  param="best_of")
        if self.logprobs is not None and not 0 <= self.logprobs <= MAX_COMPLETION_LOGPROBS:
            raise OpenAIError(f"logprobs must be in [0, {MAX_COMPLETION_LOGPROBS}]; got {self.logprobs}",
                              param="logprobs")
        if self.max_tokens == 0 and not (self.echo and self.logprobs is not None):
            raise OpenAIError("max_tokens must be at least 1; 0 only with echo and logprobs (score the prompt)",
                              param="max_tokens")
        self.prompts()

    def logprob_count(self) -> int:
        return -1 if self.logprobs is None else self.logprobs

    def candidates(self) -> int:
        return self.best_of or self.choices()

    def knobs(self) -> dict[str, Any]:
        knobs = super().knobs()
        if self.echo and self.logprobs is not None:  # the echoed prompt's log-probabilities too
            knobs["return_prompt_log_probs"] = True
        return knobs

    def prompts(self) -> list[Prompt]:
        """The request's prompts in order, each generated as a request of its own: a string, a
        list of strings, a list of token ids (one prompt) or a list of lists of token ids; none
        empty. A token id is a JSON integer in [0, 2^31 - 1]; preprocessing refuses one outside
        the vocabulary."""
        prompt = self.prompt
        if isinstance(prompt, str):
            prompts: list[Prompt] = [prompt]
        elif not prompt:
            raise OpenAIError("prompt must not be empty", param="prompt")
        elif isinstance(prompt[0], str):
            prompts = [_text(f"prompt[{i}]", p) for i, p in enumerate(prompt)]
        elif isinstance(prompt[0], list):
            prompts = [_token_ids(f"prompt[{i}]", p) for i, p in enumerate(prompt)]
        else:
            prompts = [_token_ids("prompt", prompt)]
        for i, p in enumerate(prompts):
            if not p:
                raise OpenAIError("prompt must not be empty" if len(prompts) == 1 else f"prompt[{i}] is empty",
                                  param="prompt")
        return prompts

    def prompt_texts(self) -> list[str]:
        """The text prompts (what the front's ``max_prompt_bytes`` counts)."""
        return [p for p in self.prompts() if isinstance(p, str)]


def _text(where: str, value: Any) -> str:
    if not isinstance(value, str):
        raise OpenAIError(f"{where} must be a string like the prompts before it; got {type(value).__name__}",
                          param="prompt")
    return value


def _token_ids(where: str, value: Any, param: str = "prompt") -> list[int]:
    if not isinstance(value, list):
        raise OpenAIError(f"{where} must be a list of token ids like the prompts before it; got "
                          f"{type(value).__name__}", param=param)
    for i, token in enumerate(value):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token <= INT32_MAX:
            raise OpenAIError(f"{where}[{i}] must be a token id ({TOKEN_ID_RANGE}); got {token!r}", param=param)
    return value


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[TextPart], None] = None
    name: Optional[str] = None

    def for_template(self) -> dict[str, str]:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or ())
        message = {"role": self.role, "content": text}
        if self.name:
            message["name"] = self.name
        return message


class ChatBody(GenerationBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[Count] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[Int32] = None
    tools: Optional[list[Any]] = None
    tool_choice: Optional[Any] = None
    functions: Optional[list[Any]] = None
    function_call: Optional[Any] = None
    response_format: Optional[dict[str, Any]] = None

    def check(self) -> None:
        super().check()
        for name in ("tools", "tool_choice", "functions", "function_call"):
            if getattr(self, name) not in (None, [], "none"):
                raise OpenAIError(f"{name} is not supported (no tool calling)", param=name)
        if self.top_logprobs is not None:
            if not 0 <= self.top_logprobs <= MAX_CHAT_TOP_LOGPROBS:
                raise OpenAIError(f"top_logprobs must be in [0, {MAX_CHAT_TOP_LOGPROBS}]; got {self.top_logprobs}",
                                  param="top_logprobs")
            if self.top_logprobs and not self.logprobs:
                raise OpenAIError("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.response_format and self.response_format.get("type") != "text":
            raise OpenAIError(f"response_format {self.response_format.get('type')!r} is not supported "
                              "(only 'text')", param="response_format")

    def logprob_count(self) -> int:
        return (self.top_logprobs or 0) if self.logprobs else -1

    def answer_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def template_messages(self) -> list[dict[str, str]]:
        return [m.for_template() for m in self.messages]


class TokenizerBody(BaseModel):
    """vLLM's ``/tokenize`` and ``/detokenize`` bodies: ``model`` may be left out."""

    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None

    def check(self) -> None:
        """What is well-formed but not supported, by name (unknown fields: pydantic)."""


class TokenizeCompletionBody(TokenizerBody):
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: Optional[bool] = None

    def check(self) -> None:
        if self.return_token_strs:
            raise OpenAIError("return_token_strs is not supported", param="return_token_strs")

    def prompt_texts(self) -> list[str]:
        return [self.prompt]


class TokenizeChatBody(TokenizerBody):
    """``add_special_tokens`` defaults to true, as the chat endpoint tokenizes its prompt (vLLM's
    default is false): the count is the one generation sees."""

    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = True
    return_token_strs: Optional[bool] = None

    def check(self) -> None:
        for name in ("continue_final_message", "return_token_strs"):
            if getattr(self, name):
                raise OpenAIError(f"{name} is not supported", param=name)

    def template_messages(self) -> list[dict[str, str]]:
        return [m.for_template() for m in self.messages]


class DetokenizeBody(TokenizerBody):
    tokens: list[Any]  # checked by ``check`` (one message naming the position)

    def check(self) -> None:
        _token_ids("tokens", self.tokens, param="tokens")
