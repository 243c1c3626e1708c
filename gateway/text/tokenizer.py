"""A Hugging Face tokenizer whose `encode` runs on tiktoken when that gives the same ids.

`wrap(hf)` returns a `FastTokenizer`: everything but `encode` is the HF tokenizer's
own (`apply_chat_template`, `decode`, `len()`, `eos_token_id`, ...). `encode` uses a
tiktoken `Encoding` built from the tokenizer's own serialized state, and only when
construction shows it equivalent; otherwise every call goes to HF and
`fallback_reason` says why.

Checked at construction (any failure: HF backend, reason logged):

* model: byte-level BPE (no dropout, byte fallback or affixes), every byte a token,
  ids unique. Merges are exactly the splits of tokens into two tokens, in the order
  of the merged token's id: HF merges the pair of lowest merge index, tiktoken the
  pair whose merged token has the lowest rank (= id), so both pick the same pair.
  When HF does not look a whole word up in the vocabulary first (`ignore_merges`
  off; tiktoken always does), every token must be what BPE makes of its own bytes.
* pre-tokenizer: one regex `Split` (isolated) then `ByteLevel` without its regex, or
  `ByteLevel` with its GPT-2 regex; tiktoken gets the same regex.
* added tokens: matched on the raw text with no strip / single-word rules, as HF
  does before normalizing; they become tiktoken specials (`allowed_special="all"`).
* normalizer: applied with HF's own normalizer object to each span between added
  tokens, as HF does. It is skipped when it cannot change the text: ASCII text
  for the Unicode forms, or text that Python's `unicodedata` finds normalized when
  HF's Unicode tables are not newer than Python's (checked once per process).
* a probe corpus (`probe_corpus`) encodes to the HF ids on both code paths.

Given a cache directory, the plan the checks derive (pattern, ranks, added tokens,
normalizer flags) is kept there under a hash of the serialized tokenizer, this module's
source and the libraries' versions; a later process loads it instead of re-checking
(seconds on 2 cores), still runs the probe corpus, and drops a plan that fails it.

What is not proven, only tested (probes here, fuzz in tests/unit/test_tokenizer.py):
distinct merges that yield the same token share one tiktoken rank, so when two
such pairs are candidates at once, tiktoken takes the leftmost and HF the one
listed first.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import os
import re
import time
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tiktoken

from gateway.text.probes import probe_corpus

log = logging.getLogger(__name__)

Backend = Literal["tiktoken", "huggingface"]
_Form = Literal["NFC", "NFD", "NFKC", "NFKD"]

# HF's ByteLevel pre-tokenizer regex (use_regex=true): the GPT-2 pattern.
_BYTE_LEVEL_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_UNICODE_FORMS: dict[str, _Form] = {"NFC": "NFC", "NFD": "NFD", "NFKC": "NFKC", "NFKD": "NFKD"}


class _Unsupported(Exception):
    """The tokenizer is not one tiktoken can mirror; the message says why."""


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte <-> printable-character table, as character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _byte_ranks(vocab: Mapping[str, int]) -> dict[bytes, int]:
    alphabet = _byte_level_alphabet()
    # Characters outside the alphabet become U+FFFF, which latin-1 cannot encode.
    table: dict[int, int] = {c: 0xFFFF for c in range(256)}
    table.update({ord(ch): b for ch, b in alphabet.items()})
    ranks: dict[bytes, int] = {}
    try:
        for token, token_id in vocab.items():
            ranks[token.translate(table).encode("latin-1")] = token_id
    except UnicodeEncodeError:
        raise _Unsupported("the vocabulary is not byte-level") from None
    if len(ranks) != len(vocab) or len(set(ranks.values())) != len(ranks):
        raise _Unsupported("vocabulary ids are not unique")
    if any(bytes([b]) not in ranks for b in range(256)):
        raise _Unsupported("not every byte is a token")
    return ranks


def _parse_merges(raw: Sequence[Any]) -> list[tuple[str, str]]:
    merges = []
    for m in raw:
        pair = m.split(" ") if isinstance(m, str) else m
        if len(pair) != 2:
            raise _Unsupported(f"unreadable merge {m!r}")
        merges.append((str(pair[0]), str(pair[1])))
    return merges


def _check_merges(vocab: Mapping[str, int], merges: Sequence[tuple[str, str]]) -> None:
    """Merge priority must follow the merged token's id, and every split of a token
    into two tokens must be a merge (tiktoken would merge any such pair)."""
    last = -1
    for left, right in merges:
        merged = vocab.get(left + right)
        if merged is None or left not in vocab or right not in vocab:
            raise _Unsupported(f"merge {left!r} + {right!r} is not between tokens")
        if merged < last:
            raise _Unsupported("merge order differs from token id order")
        last = merged
    if len(set(merges)) != len(merges):
        raise _Unsupported("duplicate merges")
    # The merges are splits of tokens (checked above): equal counts mean all splits.
    splits = sum(1 for t in vocab for i in range(1, len(t)) if t[:i] in vocab and t[i:] in vocab)
    if splits != len(merges):
        raise _Unsupported(f"{len(merges)} merges but {splits} token splits")


def _check_reachable(vocab: Mapping[str, int], merges: Sequence[tuple[str, str]]) -> None:
    """HF without `ignore_merges` runs BPE even on whole-token words; tiktoken looks
    them up. Same ids iff BPE turns every token's bytes into that token."""
    from tokenizers import models

    bpe = models.BPE(vocab=dict(vocab), merges=list(merges), ignore_merges=False)
    for token, token_id in vocab.items():
        pieces = bpe.tokenize(token)
        if len(pieces) != 1 or pieces[0].id != token_id:
            raise _Unsupported(f"token {token!r} is not what BPE makes of its bytes")


def _split_pattern(pre: Any) -> str:
    if not isinstance(pre, dict):
        raise _Unsupported("no pre-tokenizer")
    kind = pre.get("type")
    if kind == "ByteLevel":
        if pre.get("add_prefix_space") or not pre.get("use_regex", True):
            raise _Unsupported("ByteLevel pre-tokenizer with a prefix space or without its regex")
        return _BYTE_LEVEL_PATTERN
    if kind == "Sequence":
        parts = pre.get("pretokenizers") or []
        if len(parts) == 2 and parts[0].get("type") == "Split" and parts[1].get("type") == "ByteLevel":
            split, byte_level = parts
            if byte_level.get("add_prefix_space") or byte_level.get("use_regex"):
                raise _Unsupported("ByteLevel step with a prefix space or its own regex")
            if split.get("behavior") != "Isolated" or split.get("invert"):
                raise _Unsupported("Split pre-tokenizer is not 'Isolated'")
            regex = (split.get("pattern") or {}).get("Regex")
            if not isinstance(regex, str):
                raise _Unsupported("Split pre-tokenizer without a regex")
            return regex
    raise _Unsupported(f"pre-tokenizer {json.dumps(pre)[:200]} is not a regex split + byte-level")


def _added_tokens(raw: Sequence[Mapping[str, Any]], has_normalizer: bool) -> dict[str, int]:
    specials: dict[str, int] = {}
    flags = {bool(t.get("normalized")) for t in raw}
    # HF matches normalized=false tokens on the raw text, normalized=true ones after
    # normalizing, in two passes; one class only (and no normalizer for the second)
    # keeps it a single leftmost-longest pass like tiktoken's.
    if True in flags and (has_normalizer or False in flags):
        raise _Unsupported("added tokens matched after normalization")
    for t in raw:
        content = t.get("content")
        if not isinstance(content, str) or not content or content in specials:
            raise _Unsupported(f"added token {content!r} is empty or repeated")
        if t.get("lstrip") or t.get("rstrip") or t.get("single_word"):
            raise _Unsupported(f"added token {content!r} has strip/single-word rules")
        specials[content] = int(t["id"])
    return specials


@functools.cache
def _python_unicode_not_older() -> bool:
    """True when HF's normalization tables know no character Python calls unassigned.

    Then text Python finds normalized is left as is by HF too (normalization data of
    assigned characters never changes across Unicode versions). Each unassigned
    character sits between marks of combining class 230 and 1: HF would reorder them
    if it gave the character a class, and change it if it had a decomposition.
    """
    from tokenizers import normalizers

    unassigned = [
        chr(c)
        for block in (range(0x40000), range(0xE0000, 0xE1000))
        for c in block
        if unicodedata.category(chr(c)) == "Cn"
    ]
    probe = "".join(f"x\u0301{c}\u0334" for c in unassigned)
    return bool(normalizers.NFKD().normalize_str(probe) == probe)


def _leftmost_longest(specials: Iterable[str]) -> re.Pattern[str]:
    # Python's alternation takes the first alternative that matches: longest first.
    return re.compile("|".join(re.escape(s) for s in sorted(specials, key=len, reverse=True)))


@dataclass(frozen=True)
class _Mirror:
    """The tiktoken side of a tokenizer, and how to feed it."""

    encoding: tiktoken.Encoding
    specials: dict[str, int]
    special_re: re.Pattern[str] | None
    normalize: Callable[[str], str] | None  # HF's normalizer, per span between added tokens
    ascii_unchanged: bool  # the normalizer leaves ASCII text alone
    python_form: _Form | None  # unicodedata form whose "already normalized" HF agrees with
    whole_text: bool  # tiktoken may split added tokens itself (no one is a prefix of another)


@dataclass(frozen=True)
class _Plan:
    """What the checks derive from a tokenizer's serialized state: plain data, so a
    verified plan can be kept on disk and the checks (seconds on 2 cores) skipped."""

    pattern: str
    ranks: dict[bytes, int]
    specials: dict[str, int]
    has_normalizer: bool
    ascii_unchanged: bool
    python_form: _Form | None
    whole_text: bool


def _serialized(hf: Any) -> str:
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        raise _Unsupported("not a Hugging Face fast tokenizer")
    # transformers sets the backend's flag from this attribute on every call.
    split = getattr(hf, "split_special_tokens", None)
    if split if split is not None else getattr(backend, "encode_special_tokens", False):
        raise _Unsupported("special tokens are split as text")
    # The live backend, not tokenizer.json: transformers may rebuild parts of it.
    state: str = backend.to_str()
    return state


def _plan(state: str) -> _Plan:
    spec = json.loads(state)
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise _Unsupported(f"model type {model.get('type')!r}, not BPE")
    if model.get("dropout") or model.get("byte_fallback"):
        raise _Unsupported("BPE dropout or byte fallback")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        raise _Unsupported("BPE subword prefix/suffix")
    pattern = _split_pattern(spec.get("pre_tokenizer"))
    norm_spec = spec.get("normalizer")
    specials = _added_tokens(spec.get("added_tokens") or [], norm_spec is not None)
    vocab: dict[str, int] = model.get("vocab") or {}
    merges = _parse_merges(model.get("merges") or [])
    added_ids = set(specials.values())
    shared = [t for t, i in vocab.items() if i in added_ids]
    if shared:
        # Added tokens that are also BPE tokens (trainers put them there): HF makes
        # their ids only by matching the added token when no merge makes them and
        # whole words are not looked up, so tiktoken's ranks can leave them out.
        made = {left + right for left, right in merges}
        if model.get("ignore_merges") or any(len(t) == 1 or t in made for t in shared):
            raise _Unsupported("added tokens that BPE can also produce")
        vocab = {t: i for t, i in vocab.items() if i not in added_ids}
    ranks = _byte_ranks(vocab)
    _check_merges(vocab, merges)
    if not model.get("ignore_merges"):
        _check_reachable(vocab, merges)

    ascii_unchanged = True
    python_form: _Form | None = None
    if norm_spec is not None:
        kind = norm_spec.get("type")
        ascii_unchanged = kind in _UNICODE_FORMS
        # Whole-text checks hold for each span only when added tokens start and end
        # with ASCII, which never composes with a neighbour the way a mark can.
        if kind in _UNICODE_FORMS and all(s.isascii() for s in specials) and _python_unicode_not_older():
            python_form = _UNICODE_FORMS[kind]
    names = list(specials)
    return _Plan(
        pattern=pattern,
        ranks=ranks,
        specials=specials,
        has_normalizer=norm_spec is not None,
        ascii_unchanged=ascii_unchanged,
        python_form=python_form,
        whole_text=not any(a != b and b.startswith(a) for a in names for b in names),
    )


def _mirror(hf: Any, plan: _Plan) -> _Mirror:
    encoding = tiktoken.Encoding(
        name=f"sparkgate-{type(hf).__name__}",
        pat_str=plan.pattern,
        mergeable_ranks=plan.ranks,
        special_tokens=plan.specials,
    )
    return _Mirror(
        encoding=encoding,
        specials=plan.specials,
        special_re=_leftmost_longest(plan.specials) if plan.specials else None,
        normalize=hf.backend_tokenizer.normalizer.normalize_str if plan.has_normalizer else None,
        ascii_unchanged=plan.ascii_unchanged,
        python_form=plan.python_form,
        whole_text=plan.whole_text,
    )


# A plan on disk is reused only for the same serialized tokenizer under the same code and
# libraries: anything that could change a verdict is in its key.
_PLAN_FORMAT = 1


def _plan_key(state: str) -> str:
    import tokenizers

    h = hashlib.sha256()
    for part in (
        str(_PLAN_FORMAT),
        Path(__file__).read_text(encoding="utf-8"),
        tiktoken.__version__,
        tokenizers.__version__,
        unicodedata.unidata_version,
        state,
    ):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def _save_plan(path: Path, plan: _Plan) -> None:
    """One JSON line (everything but the ranks), then the ranks as tiktoken files hold them."""
    head = {
        "pattern": plan.pattern,
        "specials": plan.specials,
        "has_normalizer": plan.has_normalizer,
        "ascii_unchanged": plan.ascii_unchanged,
        "python_form": plan.python_form,
        "whole_text": plan.whole_text,
    }
    lines = [json.dumps(head)] + [f"{base64.b64encode(t).decode()} {r}" for t, r in plan.ranks.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # concurrent gateways: each writes its own file, the last one wins


def _load_plan(path: Path) -> _Plan:
    head_line, _, body = path.read_text(encoding="utf-8").partition("\n")
    head = json.loads(head_line)
    ranks = {base64.b64decode(t): int(r) for t, r in (line.split(" ") for line in body.splitlines())}
    form = head["python_form"]
    return _Plan(
        pattern=str(head["pattern"]),
        ranks=ranks,
        specials={str(k): int(v) for k, v in head["specials"].items()},
        has_normalizer=bool(head["has_normalizer"]),
        ascii_unchanged=bool(head["ascii_unchanged"]),
        python_form=_UNICODE_FORMS[form] if form is not None else None,
        whole_text=bool(head["whole_text"]),
    )


def _verified_mirror(hf: Any, probes: Sequence[str] | None, cache_dir: Path | None) -> tuple[_Mirror, str]:
    """The mirror and where its plan came from; the probes run either way."""
    state = _serialized(hf)
    path = cache_dir / f"{_plan_key(state)}.plan" if cache_dir is not None else None
    plan: _Plan | None = None
    if path is not None and path.is_file():
        try:
            plan = _load_plan(path)
        except (OSError, ValueError, KeyError, TypeError) as e:  # a torn or foreign file: verify again
            log.warning("tokenizer plan %s unreadable (%s); verifying again", path, e)
    if plan is not None:
        mirror = _mirror(hf, plan)
        try:
            _verify(hf, mirror, probe_corpus(mirror.specials) if probes is None else probes)
            return mirror, "verified earlier"
        except _Unsupported as e:  # a kept plan that disagrees is dropped, never trusted
            log.warning("tokenizer plan %s failed its probes (%s); verifying again", path, e)
    plan = _plan(state)
    mirror = _mirror(hf, plan)
    _verify(hf, mirror, probe_corpus(mirror.specials) if probes is None else probes)
    if path is not None:
        try:
            _save_plan(path, plan)
        except OSError as e:  # a read-only cache only costs the next start the checks
            log.warning("tokenizer plan not kept (%s)", e)
    return mirror, "verified"


class FastTokenizer:
    """The HF tokenizer's interface with a tiktoken `encode` where that is equivalent."""

    __slots__ = ("_adds_nothing", "_hf", "_len", "_mirror", "_reason", "_warned")
    _adds_nothing: bool
    _hf: Any
    _len: int
    _mirror: _Mirror | None
    _reason: str | None
    _warned: bool

    def __init__(self, hf: Any, *, probes: Sequence[str] | None = None, cache_dir: Path | None = None) -> None:
        t0 = time.perf_counter()
        mirror: _Mirror | None = None
        reason: str | None = None
        source = "verified"
        try:
            mirror, source = _verified_mirror(hf, probes, cache_dir)
        except _Unsupported as e:
            mirror, reason = None, str(e)
        except Exception as e:  # an unfamiliar tokenizer must not stop the gateway: HF stays correct
            mirror, reason = None, f"{type(e).__name__}: {e}"
        own = object.__setattr__
        own(self, "_hf", hf)
        own(self, "_mirror", mirror)
        own(self, "_reason", reason)
        own(self, "_len", len(hf))
        own(self, "_warned", False)
        # A post-processor adds its tokens to every text: a few probes tell.
        own(self, "_adds_nothing", mirror is not None and _adds_nothing(hf))
        if reason is None:
            log.info("tokenizer %s: tiktoken encode, %s in %.1fs", type(hf).__name__, source, time.perf_counter() - t0)
        else:
            log.warning("tokenizer %s: Hugging Face encode (%s)", type(hf).__name__, reason)

    @property
    def backend(self) -> Backend:
        """Which library `encode` uses."""
        return "tiktoken" if self._mirror is not None else "huggingface"

    @property
    def fallback_reason(self) -> str | None:
        """Why tiktoken is not used; None when it is."""
        return self._reason

    @property
    def hf_tokenizer(self) -> Any:
        return self._hf

    def encode(self, text: Any, text_pair: Any = None, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        """HF's `encode`; a plain string goes to tiktoken (same ids, verified)."""
        m = self._mirror
        if (
            m is not None
            and text_pair is None
            and not kwargs
            and isinstance(text, str)
            and (self._adds_nothing or not add_special_tokens)
            and not self._changed()
        ):
            ids = _encode(m, text)
            if ids is not None:
                return ids
        if text_pair is not None:
            kwargs["text_pair"] = text_pair
        return list(self._hf.encode(text, add_special_tokens=add_special_tokens, **kwargs))

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return self._hf.apply_chat_template(conversation, **kwargs)

    def decode(self, ids: Any, **kwargs: Any) -> str:
        text: str = self._hf.decode(ids, **kwargs)
        return text

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._hf(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._hf)

    def __repr__(self) -> str:
        return f"FastTokenizer(backend={self.backend!r}, hf={self._hf!r})"

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper lacks. Unset slots and dunders must not
        # recurse into or borrow from the HF object (copy/pickle probe for them).
        if name.startswith("__") or name in FastTokenizer.__slots__:
            raise AttributeError(name)
        return getattr(self._hf, name)

    def __setattr__(self, name: str, value: Any) -> None:
        # Settings such as chat_template belong to the HF tokenizer.
        if name in FastTokenizer.__slots__:
            object.__setattr__(self, name, value)
        else:
            setattr(self._hf, name, value)

    def _changed(self) -> bool:
        """The HF tokenizer gained tokens or started splitting specials since it was verified."""
        if len(self._hf) == self._len and not getattr(self._hf, "split_special_tokens", False):
            return False
        if not self._warned:
            object.__setattr__(self, "_warned", True)
            log.warning("tokenizer %s changed after verification: Hugging Face encode", type(self._hf).__name__)
        return True


def _adds_nothing(hf: Any) -> bool:
    return all(
        list(hf.encode(t, add_special_tokens=True)) == list(hf.encode(t, add_special_tokens=False))
        for t in ("", "a", " hello world", "<|im_start|>")
    )


def _encode(m: _Mirror, text: str) -> list[int] | None:
    """tiktoken ids for `text`, or None where HF must answer (lone surrogates)."""
    if text.isascii():
        if m.whole_text and (m.normalize is None or m.ascii_unchanged):
            return m.encoding.encode(text, allowed_special="all")
        return _encode_spans(m, text)
    try:  # HF rejects lone surrogates; tiktoken would replace them
        text.encode("utf-8")
    except UnicodeEncodeError:
        return None
    form = m.python_form
    if m.whole_text and (m.normalize is None or (form is not None and unicodedata.is_normalized(form, text))):
        return m.encoding.encode(text, allowed_special="all")
    return _encode_spans(m, text)


def _encode_spans(m: _Mirror, text: str) -> list[int]:
    """HF's order: split on added tokens, normalize each span, then encode it."""
    enc, norm = m.encoding, m.normalize

    def ordinary(span: str) -> list[int]:
        return enc.encode_ordinary(norm(span) if norm is not None else span)

    if m.special_re is None:
        return ordinary(text)
    ids: list[int] = []
    pos = 0
    for match in m.special_re.finditer(text):
        if match.start() > pos:
            ids += ordinary(text[pos : match.start()])
        ids.append(m.specials[match.group()])
        pos = match.end()
    if pos < len(text):
        ids += ordinary(text[pos:])
    return ids


def _verify(hf: Any, m: _Mirror, probes: Sequence[str]) -> None:
    for text in probes:
        want = list(hf.encode(text, add_special_tokens=False))
        for path, got in (("fast", _encode(m, text)), ("span", _encode_spans(m, text))):
            if got != want:
                raise _Unsupported(f"probe {text[:60]!r} differs on the {path} path")


# Engines that load the same tokenizer directory share one object (the simulated, replay and
# remote engines do): verifying it takes seconds on 2 cores, so it is done once per object.
# The entry holds the object itself, so its id cannot be reused while the entry lives.
_WRAPPED: dict[int, tuple[Any, FastTokenizer]] = {}
_MAX_WRAPPED = 8


def wrap(hf: Any, cache_dir: Path | None = None) -> FastTokenizer:
    """The tokenizer to give the gateway: tiktoken-backed `encode` where verified.

    With `cache_dir`, a verified plan is kept there and the next process that loads the
    same tokenizer skips the structural checks (the probe corpus still runs)."""
    if isinstance(hf, FastTokenizer):
        return hf
    hit = _WRAPPED.get(id(hf))
    if hit is not None and hit[0] is hf:
        return hit[1]
    fast = FastTokenizer(hf, cache_dir=cache_dir)
    if len(_WRAPPED) >= _MAX_WRAPPED:
        _WRAPPED.pop(next(iter(_WRAPPED)))
    _WRAPPED[id(hf)] = (hf, fast)
    return fast
