"""Each fit rule is stated once in app.core.placement.fit, and its faster forms answer as the rule does on
generated clusters: the node-wide rule (`host_shortfall`) against the refusal `node_misfit` gives and the
inlined copy in `headroom_fits`; the yes/no `node_fits` against `node_misfit`; `headroom_fits` (the
replay's form, from a node state's headroom) against `node_fits` for every share demand."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from app.core.errors import Shortfall
from app.core.isolation import MemoryEnforcement, Sharing
from app.core.model import Demand, Gpu, Node
from app.core.placement.fit import (
    FOREIGN_MARGIN_MIB,
    headroom,
    headroom_fits,
    host_shortfall,
    is_share,
    node_fits,
    node_misfit,
)

MEMORY = (0, 15_109, 16_384, 32_510, 40_960)  # odd sizes make the floor in Demand.on bite
MODELS = ("G2", "T4")
RULES = settings(max_examples=400, deadline=None)


@st.composite
def gpus(draw: st.DrawFn, index: int) -> Gpu:
    memory = draw(st.sampled_from(MEMORY))
    milli = draw(st.sampled_from((0, 1, 110, 250, 460, 500, 999, 1000)))
    return Gpu(
        index=index,
        model=draw(st.sampled_from(MODELS)),
        memory_mib=memory,
        milli_used=milli,
        memory_used_mib=draw(st.sampled_from((milli * memory // 1000, 0, memory, memory // 2))),
        foreign_mib=draw(st.sampled_from((0, 0, 300, 5000))),
        healthy=draw(st.booleans()),
        mig_profile=draw(st.sampled_from(("", "", "", "1g.10gb"))),
        sharing=draw(st.sampled_from(tuple(Sharing))),
        memory_enforcement=draw(st.sampled_from(tuple(MemoryEnforcement))),
    )


@st.composite
def nodes(draw: st.DrawFn, name: str = "n") -> Node:
    count = draw(st.integers(0, 8))
    return Node(
        name,
        tuple(draw(gpus(i)) for i in range(count)),
        cpu_milli_free=draw(st.sampled_from((None, 0, 1999, 4000, 96_000))),
        memory_mib_free=draw(st.sampled_from((None, 0, 3999, 8000, 393_216))),
        schedulable=draw(st.booleans()),
        mps=draw(st.booleans()),
        unschedulable_reason="cordoned",
        mps_reason="no MPS daemon",
    )


clusters = st.lists(nodes(), min_size=1, max_size=6)


@st.composite
def shares(draw: st.DrawFn) -> Demand:
    """Demands `headroom_fits` answers (`is_share`): any number of whole-GPU shares, or none."""
    count = draw(st.sampled_from((0, 1, 1, 2, 4, 8)))
    return Demand(
        count=count,
        milli=draw(st.sampled_from((0, 1, 50, 110, 250, 460, 500, 999, 1000))) if count else None,
        cpu_milli=draw(st.sampled_from((0, 2000, 12_000))),
        host_memory_mib=draw(st.sampled_from((0, 4000, 16_384))),
        needs_mps=draw(st.booleans()),
    )


@st.composite
def demands(draw: st.DrawFn) -> Demand:
    """Any demand: shares, memory asks, pinned models, isolation needs, MIG devices."""
    count = draw(st.sampled_from((0, 1, 2, 3)))
    kind = draw(st.sampled_from(("share", "memory", "mig"))) if count else "none"
    return Demand(
        count=count,
        milli=draw(st.sampled_from((250, 500, 1000))) if kind == "share" else None,
        memory_mib=draw(st.sampled_from((1000, 10_240, 20_000))) if kind in ("memory", "mig") else None,
        models=frozenset(draw(st.sets(st.sampled_from(MODELS), max_size=1))),
        cpu_milli=draw(st.sampled_from((0, 2000))),
        host_memory_mib=draw(st.sampled_from((0, 4000))),
        needs_mps=draw(st.booleans()),
        mig=kind == "mig",
        timeslice=draw(st.booleans()),
        memory_enforcement=draw(st.sampled_from(tuple(MemoryEnforcement))),
    )


def _host(node: Node, demand: Demand) -> Shortfall | None:
    return host_shortfall(node.schedulable, node.cpu_milli_free, node.memory_mib_free, node.mps, demand)


@RULES
@given(clusters, demands())
def test_a_refusal_names_the_first_node_wide_rule_broken(cluster: list[Node], demand: Demand) -> None:
    for node in cluster:
        broken = _host(node, demand)
        reason = node_misfit(node, demand)
        if broken is not None:
            assert reason is not None and reason.shortfall is broken
        elif reason is not None:  # the node passed the node-wide rule: a GPU rule refused it
            assert reason.shortfall not in (
                Shortfall.UNSCHEDULABLE,
                Shortfall.CPU,
                Shortfall.HOST_MEMORY,
                Shortfall.NO_MPS,
            )


@RULES
@given(clusters, demands())
def test_the_yes_no_check_is_the_filter_without_its_reason(cluster: list[Node], demand: Demand) -> None:
    for node in cluster:
        assert node_fits(node, demand) is (node_misfit(node, demand) is None), (node, demand)


@RULES
@given(clusters, shares())
def test_the_headroom_check_is_the_node_check_for_share_demands(cluster: list[Node], demand: Demand) -> None:
    assert is_share(demand)
    for node in cluster:
        room = headroom(node, FOREIGN_MARGIN_MIB)
        assert headroom_fits(room, demand) is node_fits(node, demand), (node, demand)
        if _host(node, demand) is not None:  # its inlined node-wide rule refuses where the rule does
            assert not headroom_fits(room, demand)
