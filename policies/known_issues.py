"""Engine flag combinations with open corruption reports, and what `sparkgate check` says of them.

Speculative decoding x prefix caching x hybrid attention (Gated DeltaNet / Mamba state groups)
is a known class of silent wrong answers: a prefix-cache hit restores recurrent state written
over rejected draft tokens. The table names each report, the vLLM versions it affects and the
alternative; `findings` is the decision for one model's flags. Values in, values out: the
gateway (gateway/check.py) reads the flags off the config and prints the findings.

A model may accept an issue (`accept_known_issues` in its settings): the finding is then a
warning naming the issue and the alternative, not a refusal. Unknown version (None): affected,
as an unfixed report must be assumed to hold for a release nobody has said fixes it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

Version = tuple[int, ...]

# vLLM's `SpeculativeConfig.use_eagle()`: the methods drafting off the target's hidden states,
# whose prefix-cache lookup drops the last matched block (the path the reports go through).
EAGLE_FAMILY = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})
# A speculative_config without a method: vLLM infers one from the draft model; assume the worst.
UNSPECIFIED = "unspecified"


@dataclass(frozen=True, slots=True)
class KnownIssue:
    id: str  # what an operator writes in accept_known_issues, e.g. "vllm#53912"
    url: str
    effect: str  # what goes wrong, in a few words
    methods: frozenset[str]  # speculative methods affected (UNSPECIFIED always is)
    architectures: tuple[str, ...] = ()  # architecture name prefixes; empty: every hybrid model
    since: Version | None = None  # first affected vLLM release; None: every earlier one too
    fixed_in: Version | None = None  # first release with the fix; None: still open
    alternative: str = "set enable_prefix_caching: false, or remove engine_args.speculative_config"

    def affects(self, version: Version | None) -> bool:
        """Whether this vLLM version has the bug (None: unknown, so assume it does)."""
        if version is None:
            return True
        if self.since is not None and version < self.since:
            return False
        return self.fixed_in is None or version < self.fixed_in

    def versions(self) -> str:
        low = "" if self.since is None else ".".join(map(str, self.since))
        high = "open" if self.fixed_in is None else "fixed in " + ".".join(map(str, self.fixed_in))
        return f"vLLM {low or 'all releases'}{'+' if low else ''}, {high}"


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    # Reported on 0.28.0 as "#43559 closed but unfixed" (reports back to 0.25); the fix
    # (vllm#57128: MambaManager.find_longest_cache_hit ignores drop_eagle_block) is unmerged.
    KnownIssue(
        id="vllm#53912",
        url="https://github.com/vllm-project/vllm/issues/53912",
        effect="prefix-cache hits restore recurrent state written over rejected drafts: corrupted tool calls "
        "and answers",
        methods=EAGLE_FAMILY,
    ),
    # Flash-Next (vLLM's Qwen4Exp) with MTP: identical prompts never hit the prefix cache, which
    # then only costs each request its extra state blocks (9 instead of 5 per request).
    KnownIssue(
        id="vllm-backport#73",
        url="https://github.com/wtdcode/vllm-backport/issues/73",
        effect="0% prefix-cache hits with MTP: the cache only costs its state blocks",
        methods=frozenset({"mtp"}),
        architectures=("Qwen4Exp",),
        alternative="set enable_prefix_caching: false (it gains nothing here)",
    ),
)
ISSUE_IDS = tuple(i.id for i in KNOWN_ISSUES)


@dataclass(frozen=True, slots=True)
class EngineFlags:
    """What the decision needs of one model's engine."""

    model: str
    speculative_method: str | None  # None: no speculative decoding
    prefix_caching: bool
    hybrid: bool
    architecture: str | None = None  # e.g. "Qwen4Exp"; None: not known here
    vllm_version: Version | None = None  # None: not known: assume affected
    accepted: tuple[str, ...] = ()  # accept_known_issues


@dataclass(frozen=True, slots=True)
class Finding:
    model: str
    issue: KnownIssue
    accepted: bool  # a warning (the operator accepted it), else a refusal

    @property
    def message(self) -> str:
        i = self.issue
        head = (
            f"model {self.model!r}: speculative decoding with prefix caching on a hybrid model has an open "
            f"report, {i.id} ({i.effect}; {i.versions()}; {i.url})"
        )
        if self.accepted:
            return f"{head}: accepted (accept_known_issues); the canary checks it; the alternative: {i.alternative}"
        return f"{head}: {i.alternative}, or accept it with accept_known_issues: [{i.id!r}] and run the canary"


def parse_version(text: str | None) -> Version | None:
    """`0.32.0`, `0.32.1rc1.dev5+gabc` -> (0, 32, 0) / (0, 32, 1); None for None or no number."""
    if text is None:
        return None
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", text)
    return None if m is None else tuple(int(p) for p in m.group(1).split("."))


def _applies(issue: KnownIssue, flags: EngineFlags) -> bool:
    if not (flags.hybrid and flags.prefix_caching and flags.speculative_method is not None):
        return False
    method = flags.speculative_method
    if method != UNSPECIFIED and method not in issue.methods:
        return False
    if issue.architectures and not (flags.architecture or "").startswith(issue.architectures):
        return False
    return issue.affects(flags.vllm_version)


def findings(flags: EngineFlags, table: Sequence[KnownIssue] = KNOWN_ISSUES) -> list[Finding]:
    """The open reports this model's flags run into: refused unless it accepts them."""
    return [Finding(flags.model, i, i.id in flags.accepted) for i in table if _applies(i, flags)]


def unknown_issues(accepted: Sequence[str], table: Sequence[KnownIssue] = KNOWN_ISSUES) -> list[str]:
    """Accepted ids the table does not have (a typo would accept nothing)."""
    known = {i.id for i in table}
    return [a for a in accepted if a not in known]
