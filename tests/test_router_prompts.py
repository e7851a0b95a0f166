"""The router's training prompts are disjoint from what the benchmarks evaluate."""
from __future__ import annotations

import re

from tokenrouter_backend.bench.workloads import ALL_WORKLOADS, humaneval_problems, load_workloads
from tokenrouter_backend.learning.router_prompts import training_prompts
from tokenrouter_backend.learning.router_prompts_more import more_training_prompts

DEFINED = re.compile(r"^\s*(?:def|class)\s+(?!__)(\w+)", re.M)  # dunders are shared by design


def test_training_prompts_share_no_text_or_defined_name_with_benchmarks():
    train = training_prompts() + more_training_prompts()
    assert len({p.name for p in train}) == len(train)
    bench = [p.text for p in load_workloads(ALL_WORKLOADS, full=True)]
    bench_names = {name for text in bench for name in DEFINED.findall(text)}
    bench_names |= {p["entry_point"] for p in humaneval_problems()}
    for p in train:
        assert p.text not in bench and not any(p.text in b or b in p.text for b in bench), p.name
        assert not set(DEFINED.findall(p.text)) & bench_names, (p.name, set(DEFINED.findall(p.text)) & bench_names)


def test_more_prompts_hold_thirty_of_each_kind():
    more = more_training_prompts()
    assert len(more) == 120
    assert sum(p.chat for p in more) == 30
    assert [p.chat for p in more] == [False] * 90 + [True] * 30
