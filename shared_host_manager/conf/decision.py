"""Options of the decision path (groups ``[scheduler]`` and ``[filter_scheduler]``, nova's names).

Role: the operator's manual for filtering, weighing, alternates and collision
avoidance, generated into the sample config through :func:`list_opts`
(entry point ``oslo.config.opts``: ``shm.scheduler =
shared_host_manager.conf.decision:list_opts``).

The decision path itself never reads a global ConfigOpts: the service layer
calls :func:`register_opts` once and hands :meth:`SchedulerConfig.from_conf`
to the engine, so the engine, filters and weighers stay plain objects that
tests build with keyword arguments.  Life cycle: options are read when the
engine is built; a SIGHUP-style reload means building a new engine.

Option names, defaults and meanings follow nova 34 (``nova/conf/scheduler.py``)
where nova has the option; ``host_subset_size_min``/``_max`` and the
``claim_rejection_*`` options replace nova's fixed ``host_subset_size`` with an
adaptive one (see :mod:`shared_host_manager.decision.subset`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from oslo_config import cfg

SCHEDULER_GROUP = "scheduler"
FILTER_GROUP = "filter_scheduler"

#: nova's default filters, plus what placement decides in nova (ResourceFitFilter,
#: AvailabilityZoneFilter for the AZ prefilter) and the filters that are no-ops
#: unless the request asks for them (hints, extra specs, tenant isolation).
DEFAULT_FILTERS = (
    "ComputeFilter",
    "ResourceFitFilter",
    "AvailabilityZoneFilter",
    "ImagePropertiesFilter",
    "ServerGroupAntiAffinityFilter",
    "ServerGroupAffinityFilter",
    "SameHostFilter",
    "DifferentHostFilter",
    "AggregateInstanceExtraSpecsFilter",
    "AggregateMultiTenancyIsolation",
    "VolumeLocalityFilter",
)
DEFAULT_WEIGHERS = ("RAMWeigher", "CPUWeigher", "DiskWeigher", "NumInstancesWeigher", "IoOpsWeigher")

scheduler_opts: list[cfg.Opt] = [
    cfg.IntOpt("max_attempts", default=3, min=1, help="""
The maximum number of hosts tried for one instance: the selected host plus
``max_attempts - 1`` alternates. When a compute node rejects a claim (or the
claim expires without an answer), the request tracker claims the next
alternate, after re-checking that it still fits in this scheduler's view; when
all are used up the instance fails with NoValidHost.

nova: [scheduler] max_attempts (same default).

Possible values: a positive integer; 1 disables alternates.
"""),
]

filter_opts: list[cfg.Opt] = [
    cfg.ListOpt("enabled_filters", default=list(DEFAULT_FILTERS), help="""
Filters applied, in order, to every host for every request. A host must pass
all of them. A name nova 34 has a filter class for is nova's own class (see
decision_core); the others are looked up in the ``shm.scheduler.filters``
entry point group, then in the built-in table, so a plugin only needs an entry
point.

The built-in filters are what nova has no class for: ResourceFitFilter (what
placement decides in nova: vcpus, memory_mb, disk_gb fit with allocation
ratios, minus this scheduler's pending claims), AvailabilityZoneFilter (the
former nova filter; nova's API and placement decide it today), and
VolumeLocalityFilter (hint ``near_volume``: only hosts local to the volume
backend holding the volume).

Related options: max_instances_per_host, max_io_ops_per_host.
"""),
    cfg.ListOpt("weight_classes", default=list(DEFAULT_WEIGHERS), help="""
Weighers applied to the hosts that passed every filter. Each weigher's raw
value is normalised to 0..1 over those hosts (nova's BaseWeightHandler) and
multiplied by its multiplier; the host weight is the sum. Names are looked up
in the ``shm.scheduler.weighers`` entry point group, then the built-in table.

Related options: the *_weight_multiplier options.
"""),
    cfg.FloatOpt("ram_weight_multiplier", default=1.0, help="""
Multiplier of the RAMWeigher (free RAM, without allocation ratio). Positive
spreads instances over hosts, negative stacks them. An aggregate's
``ram_weight_multiplier`` metadata overrides it for its hosts (the minimum
wins when a host is in several).
"""),
    cfg.FloatOpt("cpu_weight_multiplier", default=1.0, help="""
Multiplier of the CPUWeigher (vcpus * cpu_allocation_ratio - vcpus_used).
Positive spreads, negative stacks. Aggregate metadata
``cpu_weight_multiplier`` overrides it.
"""),
    cfg.FloatOpt("disk_weight_multiplier", default=1.0, help="""
Multiplier of the DiskWeigher (free disk, without allocation ratio). Positive
spreads, negative stacks. Aggregate metadata ``disk_weight_multiplier``
overrides it.
"""),
    cfg.FloatOpt("num_instances_weight_multiplier", default=0.0, help="""
Multiplier of the NumInstancesWeigher. Positive prefers hosts with more
instances (stacking), negative prefers fewer (spreading); 0 ignores it.
Aggregate metadata ``num_instances_weight_multiplier`` overrides it.
"""),
    cfg.FloatOpt("io_ops_weight_multiplier", default=-1.0, help="""
Multiplier of the IoOpsWeigher (builds, resizes and snapshots in flight,
including this scheduler's pending claims). Negative prefers idle hosts.
Aggregate metadata ``io_ops_weight_multiplier`` overrides it.
"""),
    cfg.IntOpt("max_instances_per_host", default=50, min=1, help="""
NumInstancesFilter: hosts with this many instances (our pending claims
included) or more are filtered out.
"""),
    cfg.IntOpt("max_io_ops_per_host", default=8, min=1, help="""
IoOpsFilter: hosts with this many concurrent I/O-heavy operations (our
pending claims included) or more are filtered out.
"""),
    cfg.IntOpt("host_subset_size_min", default=1, min=1, help="""
Smallest number of best-weighed hosts the selected host is chosen from at
random. With one live scheduler and no claim rejections the subset stays at
this size (1 = always the best host, nova's default host_subset_size).

Related options: host_subset_size_max, claim_rejection_target.
"""),
    cfg.IntOpt("host_subset_size_max", default=16, min=1, help="""
Largest random subset. Several schedulers deciding on the same view pick the
same best host and all but one get their claim rejected; the subset grows
with the number of live schedulers and with the observed rejection rate,
trading a little placement quality for fewer collisions, up to this bound.
Set equal to host_subset_size_min for a fixed size (nova's host_subset_size).
"""),
    cfg.StrOpt("host_subset_choice", default="rendezvous", choices=["rendezvous", "random"],
               help="""
How the selected host is chosen among the best-weighed subset. 'random':
uniformly at random for every instance (nova's way): two concurrent
decisions of different schedulers collide with probability 1/subset.
'rendezvous': each scheduler prefers the subset host with the highest hash of
(scheduler name, host); different schedulers then prefer different hosts for
as long as the subset is stable, and collide only when their preferences meet.

Related options: host_subset_size_min, host_subset_size_max.
"""),
    cfg.BoolOpt("scarce_coordinator", default=True, help="""
With live peers (``[cache] membership_interval``), hand every scarce request
(one at most 2 hosts per live scheduler fit) to one coordinating scheduler,
the live peer first by name, which decides and claims it in its stead: two
scarce requests decided by different schedulers in the same few milliseconds
otherwise claim the same few hosts, and most claims rejected between
active-active schedulers are those. The scheduler handing a request over
waits for its answer (one cast each way). False: every scheduler decides its
own scarce requests, spread over the candidates by a shared matching.
"""),
    cfg.BoolOpt("hand_to_owner", default=True, help="""
With live peers (``[cache] membership_interval``), a request for which this
scheduler owns none of the best hosts is handed to the live peer owning the
best one, which decides and claims it with its own requests (one cast each
way): otherwise this scheduler claims a peer's host while that peer may be
claiming it, the other main source of claims rejected between active-active
schedulers. False: take the peer's host least likely to be claimed by its
owner at that moment.
"""),
    cfg.FloatOpt("no_valid_host_catch_up", default=0.05, min=0.0, help="""
Before answering NoValidHost, a scheduler waits this many seconds for what
the hosts changed just before it decided to reach the stream (set it to the
reporters' ``[reporter] coalesce_window``), then until its cache has applied
everything on the stream (it puts its own membership entry, ``[cache]
membership_interval``, on the stream and waits for it to come back, at most
1 s), and decides once more. A host freed a moment before the decision, whose
delta was still on its way, then counts instead of the request failing. Costs
this wait and one stream round trip, on refused requests only. 0, or no
membership entry: answer at once.
"""),
    cfg.FloatOpt("claim_rejection_target", default=0.05, min=0.0001, max=1.0, help="""
Claim rejection rate (rejected / resolved claims, as an EWMA) at which the
subset doubles the share that comes from concurrent schedulers.
"""),
    cfg.FloatOpt("claim_rejection_ewma_alpha", default=0.05, min=0.0001, max=1.0, help="""
Weight of each new claim outcome in the rejection-rate EWMA: larger reacts
faster, smaller is steadier.
"""),
    cfg.StrOpt("default_availability_zone", default="nova", help="""
Availability zone of hosts in no aggregate with ``availability_zone``
metadata (nova: [DEFAULT] default_availability_zone), used by
AvailabilityZoneFilter.
"""),
    cfg.StrOpt("decision_core", default="nova", help="""
The decision core whose filter and weigher classes the engine (``shm sim``'s
shared, legacy and caching modes, its scheduler processes, ``shm replay
--decisions``, ``shm bench decisions``) loads for the names in enabled_filters
and weight_classes, by its name in the ``shm.scheduler.cores`` entry point
group.
``nova`` (the only core shipped): nova 34's own class for every name nova has
one for, deciding through the same vector core as the drop-in (docs/design.md
§5.8); the names nova has no class for (ResourceFitFilter,
AvailabilityZoneFilter, VolumeLocalityFilter) are the engine's own. Needs nova
34 installed (the ``sim`` and ``nova`` extras install it).
"""),
    cfg.StrOpt("image_properties_default_architecture", help="""
Architecture assumed by ImagePropertiesFilter when the image has no
``hw_architecture`` property (nova option of the same name). Unset: no
assumption.
"""),
]


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Plain values of the options above (what the engine, filters and weighers read)."""

    enabled_filters: tuple[str, ...] = DEFAULT_FILTERS
    weight_classes: tuple[str, ...] = DEFAULT_WEIGHERS
    ram_weight_multiplier: float = 1.0
    cpu_weight_multiplier: float = 1.0
    disk_weight_multiplier: float = 1.0
    num_instances_weight_multiplier: float = 0.0
    io_ops_weight_multiplier: float = -1.0
    max_instances_per_host: int = 50
    max_io_ops_per_host: int = 8
    max_attempts: int = 3
    host_subset_size_min: int = 1
    host_subset_size_max: int = 16
    host_subset_choice: str = "rendezvous"
    scarce_coordinator: bool = True
    hand_to_owner: bool = True
    no_valid_host_catch_up: float = 0.05
    claim_rejection_target: float = 0.05
    claim_rejection_ewma_alpha: float = 0.05
    default_availability_zone: str = "nova"
    image_properties_default_architecture: str | None = None
    decision_core: str = "nova"

    @classmethod
    def from_conf(cls, conf: cfg.ConfigOpts) -> SchedulerConfig:
        # oslo.config's values are untyped here; each was converted and checked by its Opt
        values: dict[str, Any] = {}
        groups = {SCHEDULER_GROUP: conf[SCHEDULER_GROUP], FILTER_GROUP: conf[FILTER_GROUP]}
        for f in fields(cls):
            group = groups[SCHEDULER_GROUP if f.name == "max_attempts" else FILTER_GROUP]
            value = group[f.name]
            values[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(scheduler_opts, group=SCHEDULER_GROUP)
    conf.register_opts(filter_opts, group=FILTER_GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(SCHEDULER_GROUP, scheduler_opts), (FILTER_GROUP, filter_opts)]


__all__ = ["DEFAULT_FILTERS", "DEFAULT_WEIGHERS", "SchedulerConfig", "list_opts", "register_opts"]
