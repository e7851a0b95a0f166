"""Router knobs: one parser, one set of documented defaults, one error type.

``RouterDefaults`` comes from the router's config.pbtxt ``parameters`` (parsed once at
start); ``RouterParams`` is what one request runs with: the defaults overridden by the
request's optional inputs. Every check raises ``InvalidRequest`` naming the field, the
value and what is allowed — never a silent fallback.

Every config.pbtxt ``parameters`` string of this project (router, operations, branch
models, preprocessing) is converted by ``parse_config_value``: one truthy set, one
int/float rule. A config dataclass (the router's, operations', a branch model's) is read by
``dataclass_from_config``: its fields' defaults are the documented defaults, ``ConfigCheck``
adds bounds or allowed names, and every bad value is reported by ``config_error`` in one
wording.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Mapping

# MODES, SCHEDULES re-exported: callers validate names against them
from tokenrouter_backend.core.protocol.names import HEAVY, LIGHT, MODES, SCHEDULES, Mode, Schedule  # noqa: F401

TRUTHY = {"1", "true", "yes", "on"}
FALSY = {"0", "false", "no", "off"}
_ABSENT = object()  # config_value default meaning "keep the dataclass default"
MIN_TEMPERATURE = 0.01  # smallest sampling temperature (0 = greedy); smaller ones overflow logits / T
MAX_TEMPERATURE = 100.0


class InvalidRequest(ValueError):
    """A request field is missing, malformed or out of range (message names the field)."""



@dataclass(frozen=True)
class NgramSettings:
    """One request's n-gram knobs (``RouterParams``)."""

    enabled: bool = True
    light_copies: bool = False  # route, greedy: copies read by the light model in one forward
    heavy_steps: bool = True  # also in the cost model's heavy-only steps (copies replace heavy tokens)
    min_n: int = 3  # shortest suffix matched
    max_n: int = 5  # longest suffix matched (tried first)
    max_draft: int = 16  # most n-gram tokens one heavy check carries
    first_draft: int = 8  # draft length of the first n-gram block

@dataclass(frozen=True)
class RouterDefaults:
    """Server-wide defaults and limits (config.pbtxt parameters of the router model)."""

    mode: Mode = Mode.VERIFY  # lossless by default; "route" trades exactness for speed
    max_tokens: int = 64  # when a request gives no max_tokens
    max_tokens_limit: int = 4096  # largest max_tokens a request may ask for
    max_context: int = 32768  # prompt + generated tokens must fit (model's positions)
    block_size: int = 5  # first block size k (tokens drafted per light call)
    max_block_size: int = 16  # adaptive schedule never drafts more (branch max_draft_len)
    block_schedule: Schedule = Schedule.HEURISTIC  # fixed | heuristic (+2 on full accept, -1 else)
    confidence_threshold: float = 0.8  # route: light top-1 prob needed to commit unchecked
    entropy_threshold: float = math.inf  # route: light entropy (nats) allowed; inf = off
    margin_threshold: float = 0.0  # route, confidence rule: light top-1 minus top-2 prob needed; 0 = off
    rollback_threshold: float = 0.05  # route: heavy prob of a committed token below which it is rolled back
    rollback_window: int = 32  # route: unverified tokens held back (streaming) for rollback
    draft_confidence_threshold: float = 0.4  # verify: light stops drafting below this prob
    heavy_model: str = HEAVY  # Triton model names of the branches
    light_model: str = LIGHT
    heavy_url: str = ""  # gRPC host:port of a separate heavy server; "" = same server (BLS)
    max_input_tokens: int = 16384  # longest prompt (tokens) a request may send
    prefill_chunk_tokens: int = 256  # a longer branch input is sent in calls of this many tokens
    heavy_first: bool = True  # verify/route: heavy prefills first, its first token is emitted at once
    branch_timeout_s: float = 300.0  # deadline of one branch call (BLS or remote)
    ngram_drafts: bool = True  # verify/route: propose copies of earlier text before asking the light model
    ngram_min: int = 3  # shortest suffix an n-gram draft matches
    ngram_max: int = 5  # longest suffix an n-gram draft matches (tried first)
    ngram_max_draft: int = 16  # most n-gram tokens one heavy check carries
    light_copies: bool = True  # route, greedy: n-gram copies read by the light model in one forward
    light_kv_window: int = 512  # verify: light branch keeps its sink + this many recent positions; 0 = all
    answer_cache_entries: int = 256  # decision cache: earlier answers kept (by prompt) as drafts; 0 = off
    require_cache_salt: bool = False  # refuse requests without a cache_salt (every request names its tenant)

    @classmethod
    def from_config(cls, parameters: Mapping[str, str]) -> "RouterDefaults":
        """Parse config.pbtxt parameters (string values); unknown keys are ignored."""
        defaults = dataclass_from_config(cls, parameters)
        checked = defaults.request_params({})  # validates the defaults with the request rules
        return dataclasses.replace(defaults, mode=checked.mode, block_schedule=checked.block_schedule)

    def request_params(self, given: Mapping[str, Any]) -> "RouterParams":
        """Apply one request's optional inputs (python scalars) to these defaults."""
        return RouterParams.build(self, given)


@dataclass(frozen=True)
class RouterParams:
    """What one request runs with (all fields validated)."""

    mode: Mode
    max_tokens: int
    block_size: int
    max_block_size: int
    block_schedule: Schedule
    confidence_threshold: float
    entropy_threshold: float
    rollback_threshold: float
    rollback_window: int
    draft_confidence_threshold: float
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    random_seed: int = 0
    stream: bool = False
    prefill_chunk_tokens: int = 256
    heavy_first: bool = True
    allow_degradation: bool = False  # route: this request accepts a lower threshold under overload
    ngram: NgramSettings = NgramSettings()  # n-gram (prompt-lookup) drafts
    light_kv_window: int = 0  # light branch KV window (0 = the whole sequence)
    answer_cache: bool = True  # an earlier answer to the same prompt may be drafted (decision cache)
    margin_threshold: float = 0.0  # route, confidence rule: top-1 minus top-2 probability needed (server-wide)
    # the learned router's P(disagree) bar: the request's input, replaced per block by a dynamic one
    router_threshold: float = -1.0  # < 0 = the router file's (or config router_threshold)
    # set per block by operations (not a request input)
    router_scale: float = 1.0  # < 1 while the conservative start holds the router stricter

    @classmethod
    def build(cls, d: RouterDefaults, given: Mapping[str, Any]) -> "RouterParams":
        def pick(name, default):
            value = given.get(name)
            return default if value is None else value

        mode = _name_in("router_mode", pick("router_mode", d.mode), Mode)
        schedule = _name_in("block_schedule", pick("block_schedule", d.block_schedule), Schedule)
        return cls(
            mode=mode,
            max_tokens=_int_in("max_tokens", pick("max_tokens", d.max_tokens), 1, d.max_tokens_limit),
            block_size=_int_in("block_size", pick("block_size", d.block_size), 1, d.max_block_size),
            max_block_size=d.max_block_size,
            block_schedule=schedule,
            confidence_threshold=_float_in(
                "confidence_threshold", pick("confidence_threshold", d.confidence_threshold), 0.0, 2.0),
            entropy_threshold=_float_in(
                "entropy_threshold", pick("entropy_threshold", d.entropy_threshold), 0.0, math.inf),
            rollback_threshold=_float_in(
                "rollback_threshold", pick("rollback_threshold", d.rollback_threshold), 0.0, 1.0),
            rollback_window=_int_in(
                "rollback_window", pick("rollback_window", d.rollback_window), 1, d.max_tokens_limit),
            draft_confidence_threshold=_float_in(
                "draft_confidence_threshold", pick("draft_confidence_threshold", d.draft_confidence_threshold), 0.0, 1.0
            ),
            temperature=_temperature(pick("temperature", 0.0)),
            top_k=_int_in("top_k", pick("top_k", 0), 0, 1 << 30),
            top_p=_float_in("top_p", pick("top_p", 1.0), 1e-6, 1.0),
            min_p=_float_in("min_p", pick("min_p", 0.0), 0.0, 1.0),
            random_seed=_int_in("random_seed", pick("random_seed", 0), 0, (1 << 64) - 1),
            stream=_bool("stream", pick("stream", False)),
            prefill_chunk_tokens=_int_in("prefill_chunk_tokens", d.prefill_chunk_tokens, 1, 1 << 20),
            heavy_first=d.heavy_first,
            allow_degradation=_bool("allow_degradation", pick("allow_degradation", False)),
            ngram=_ngram_settings(d, mode, given.get("ngram_drafts"), given.get("light_copies")),
            light_kv_window=_light_window(d, mode, given.get("light_kv_window")),
            answer_cache=_bool("answer_cache", pick("answer_cache", True)),
            margin_threshold=_float_in("margin_threshold", d.margin_threshold, 0.0, 1.0),
            router_threshold=_router_threshold(given.get("router_threshold")),
        )


def _router_threshold(asked: Any) -> float:
    """The request's learned-router bar: P(disagree) in [0, 1], or -1 (not asked: the router's own)."""
    return -1.0 if asked is None else _float_in("router_threshold", asked, 0.0, 1.0)


def _light_window(d: RouterDefaults, mode: Mode, asked: Any) -> int:
    """The request's light KV window: as asked, else the default in verify mode only (there it
    cannot change the output; route commits unchecked light tokens, so it asks explicitly)."""
    if asked is not None:
        return _int_in("light_kv_window", asked, 0, d.max_context)
    window = _int_in("light_kv_window", d.light_kv_window, 0, d.max_context)
    return window if mode == Mode.VERIFY else 0


def _ngram_settings(d: RouterDefaults, mode: Mode, asked: Any, light_asked: Any = None) -> NgramSettings:
    """As asked, else the config default in verify mode only: there the drafts cannot change
    a greedy answer; a route request asks for them (they replace light tokens by heavy-checked
    copies, so route's light-share limits would no longer hold by default). In the cost
    model's heavy-only steps they replace heavy tokens: there the config default holds in
    both modes. Route's light copies (``light_copies``: the light model reads the copy, the
    route gate decides as for any light draft) follow the config default unless asked."""
    enabled = asked if asked is not None else d.ngram_drafts and mode == Mode.VERIFY
    # in the cost model's heavy-only steps a copy replaces a heavy token, never a light one
    heavy_steps = asked if asked is not None else d.ngram_drafts
    low = _int_in("ngram_min", d.ngram_min, 1, 64)
    high = _int_in("ngram_max", d.ngram_max, low, 64)
    longest = _int_in("ngram_max_draft", d.ngram_max_draft, 1, 256)
    light = _bool("light_copies", d.light_copies if light_asked is None else light_asked)
    return NgramSettings(enabled=_bool("ngram_drafts", enabled), heavy_steps=_bool("ngram_drafts", heavy_steps),
                         light_copies=light and mode == Mode.ROUTE,
                         min_n=low, max_n=high, max_draft=longest, first_draft=min(8, longest))


def _name_in(name: str, value: Any, kind: type[Mode] | type[Schedule]):
    """A request/config name (case and blanks ignored) -> its enum member."""
    text = str(value).strip().lower()
    if text not in kind.values():
        raise InvalidRequest(f"{name} must be one of {', '.join(kind.values())}; got {text!r}")
    return kind(text)


def _int_in(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        raise InvalidRequest(f"{name} must be an integer in [{low}, {high}]; got {value!r}")
    value = int(value)
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be in [{low}, {high}]; got {value}")
    return value


def _float_in(name: str, value: Any, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise InvalidRequest(f"{name} must be a number in [{low}, {high}]; got {value!r}")
    value = float(value)
    if not low <= value <= high:
        raise InvalidRequest(f"{name} must be in [{low}, {high}]; got {value}")
    return value


def _temperature(value: Any) -> float:
    """0 (greedy) or in [MIN_TEMPERATURE, MAX_TEMPERATURE]: below the minimum, logits / T
    overflow float32 and the probabilities become NaN."""
    value = _float_in("temperature", value, 0.0, MAX_TEMPERATURE)
    if 0.0 < value < MIN_TEMPERATURE:
        raise InvalidRequest(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}]; "
                             f"got {value}")
    return value


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, (bool, int)):
        return bool(value)
    raise InvalidRequest(f"{name} must be a boolean; got {value!r}")


def parse_config_value(text: str, kind: type) -> Any:
    """One config.pbtxt string -> ``kind`` (bool: the one truthy set; int; float; else the
    stripped text). Raises ValueError when malformed."""
    text = text.strip()
    if kind is bool:
        if text.lower() in TRUTHY:
            return True
        if text.lower() in FALSY:
            return False
        raise ValueError(text)
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    return text


def config_error(key: str, allowed: str, got: Any, model: str = "") -> InvalidRequest:
    """The one wording of a bad config.pbtxt parameter: its name, what it allows, what it got
    (``model``: the model whose config it is, for models that say so)."""
    where = f"{model}: " if model else ""
    return InvalidRequest(f"{where}config parameter {key} must be {allowed}; got {got!r}")


def _kind_words(kind: type) -> str:
    return "true or false" if kind is bool else kind.__name__


def config_value(parameters: Mapping[str, str], key: str, kind: type, default: Any, model: str = "") -> Any:
    """A config.pbtxt parameter as ``kind``; absent or empty -> ``default``.

    A malformed value raises ``InvalidRequest`` naming the parameter.
    """
    if key not in parameters or parameters[key] == "":
        return default
    try:
        return parse_config_value(parameters[key], kind)
    except ValueError as exc:
        raise config_error(key, _kind_words(kind), parameters[key].strip(), model) from exc


@dataclass(frozen=True)
class ConfigCheck:
    """What one config parameter allows beyond its type: a lower bound, or a set of names."""

    low: float | None = None  # the smallest value allowed
    choices: tuple[str, ...] = ()  # the names allowed (empty: any)

    def check(self, key: str, value: Any, text: str, model: str = "") -> None:
        if self.low is not None and value < self.low:
            raise config_error(key, f">= {self.low}", text, model)
        if self.choices and value not in self.choices:
            raise config_error(key, "one of " + ", ".join(self.choices), text, model)


def _field_default(f: dataclasses.Field) -> Any:
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def config_keys(cls, prefix: str = "") -> set[str]:
    """Every parameter name ``dataclass_from_config(cls, ..., prefix)`` reads."""
    keys = set()
    for f in dataclasses.fields(cls):
        default = _field_default(f)
        keys |= config_keys(type(default), prefix) if dataclasses.is_dataclass(default) else {prefix + f.name}
    return keys


def dataclass_from_config(cls, parameters: Mapping[str, str], prefix: str = "", *,
                          checks: Mapping[str, ConfigCheck] | None = None, model: str = "", strict: bool = False):
    """A frozen config dataclass from config.pbtxt parameters named ``prefix + field``.

    Each field is read with ``config_value`` as the type of its default; absent or empty
    keys keep the default. A field whose default is itself a dataclass is read the same way
    from the same parameters (its fields are parameters of their own). ``checks`` (by
    parameter name) adds a lower bound or the allowed names. ``strict``: every parameter
    must name a field and none may be an unfilled ``${...}`` placeholder (a model whose
    parameters are all read here; the router's are shared by several dataclasses, so it
    ignores the keys one does not read). Errors are ``InvalidRequest`` naming the
    parameter (and ``model``, when given).
    """
    if strict:
        known = config_keys(cls, prefix)
        where = f"{model}: " if model else ""
        for key, text in parameters.items():
            if key not in known:
                raise InvalidRequest(f"{where}unknown config parameter {key!r} (known: {', '.join(sorted(known))})")
            if "${" in text:
                raise InvalidRequest(f"{where}config parameter {key} is the unfilled placeholder {text!r}; "
                                     "run the exporter to fill the repository")
    return _from_config(cls, parameters, prefix, checks or {}, model)


def _from_config(cls, parameters: Mapping[str, str], prefix: str, checks: Mapping[str, ConfigCheck], model: str):
    values = {}
    for f in dataclasses.fields(cls):
        default = _field_default(f)
        if dataclasses.is_dataclass(default):
            values[f.name] = _from_config(type(default), parameters, prefix, checks, model)
            continue
        key = prefix + f.name
        value = config_value(parameters, key, type(default), _ABSENT, model)
        if value is _ABSENT:
            continue
        if key in checks:
            checks[key].check(key, value, parameters[key].strip(), model)
        values[f.name] = value
    return cls(**values)
