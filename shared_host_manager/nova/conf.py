"""The ``[shared_host_manager]`` options, registered in nova's own configuration.

nova-scheduler-shared and nova-compute-shared read these from nova.conf.  The
host-state stream itself ([cache] or [reporter], [data_plane],
[control_plane], [signing]) is configured in a separate file
(``config_files``): nova.conf already has an oslo.cache ``[cache]`` section,
and mixing the two would be confusing to read and easy to break.
"""

from __future__ import annotations

from oslo_config import cfg

from shared_host_manager.gc_threshold import YOUNG_THRESHOLD

GROUP = "shared_host_manager"

opts = [
    cfg.ListOpt("config_files", default=["/etc/nova/shared-host-manager.conf"], help="""
Configuration files of the host-state stream, read with a configuration object
of their own: the scheduler reads [cache], [data_plane], [control_plane] and
[signing] from them, nova-compute reads [reporter], [data_plane],
[control_plane] and [signing].

Related options: none; see etc/shm.conf.sample for the sections' options.
"""),
    cfg.BoolOpt("register_claims", default=True, help="""
After nova's placement claim for an instance succeeds, record it as a pending
claim (id = instance uuid) on the chosen host in this scheduler's cache, so
that the requests that follow, in this process, see the host's RAM, disk,
vCPUs, instance and io_ops counts reduced until the compute node's own report
includes the instance. Without it, as in nova, a request sees only what the
compute nodes reported.

Related options: [cache] claim_deadline bounds how long an unreported claim
is deducted.
"""),
    cfg.StrOpt("default_cell_uuid", help="""
Cell of hosts whose document carries no cell_uuid (computes not configured
with [shared_host_manager] cell_uuid). nova's alternates must share the
selected host's cell, and Selection objects carry it. Unset: such hosts have
no cell (fine for a single-cell deployment only if every compute sets
cell_uuid).
"""),
    cfg.BoolOpt("min_compute_version_from_stream", default=True, help="""
Answer the scheduler's "minimum nova-compute service version" question (asked
by the owner_nova_filter request filter on every request, with a query to
every cell database) from the service versions the computes publish. Falls
back to nova's query while any active host has not published its version.
"""),
    cfg.BoolOpt("vector_decisions", default=True, help="""
Decide get_filtered_hosts and get_weighed_hosts with the vector forms of
nova's in-tree filters and weighers (the same results as nova's handlers,
computed for all hosts at once; only the hosts nova's manager then uses become
HostState objects). Filters and weighers without a vector form, including
out-of-tree ones, run as nova's own classes on the surviving hosts. False:
nova's handlers, once per host, as in nova.
"""),
    cfg.BoolOpt("host_ownership", default=False, help="""
(nova-scheduler) With several schedulers: put first, among the best-weighed
hosts, the best one this scheduler *owns* (rendezvous hashing of host and
scheduler names over the live schedulers, which every scheduler computes alike
from the stream without talking to the others), so that schedulers deciding
at the same moment choose different hosts instead of racing each other to the
same one in placement. It looks at most twice as many hosts deep as there are
live schedulers and keeps nova's order when none of those is its own; the
alternates keep nova's order. False: nova's order exactly (with
host_subset_size, nova's own collision avoidance).

Related options: needs [cache] membership_interval > 0 in the stream
configuration (each scheduler's own entry on the stream); [filter_scheduler]
host_subset_size applies after it.
"""),
    cfg.IntOpt("gc_young_threshold", default=YOUNG_THRESHOLD, min=0, help="""
(nova-scheduler) Python's first garbage-collector threshold in the scheduler
process (gc.set_threshold), set when the host-state cache starts. Each request
makes a few objects per host (the per-request host views, nova's weighed
hosts); with Python's default (700) enough of them live through a young
collection to trigger full collections of the whole heap, whose size grows with
the cache: at 10 000 hosts that is about 2 million objects, and full
collections then cost more than the decisions. With a threshold above what one
request makes, its objects are freed by reference counting before a collection
runs. 0 leaves Python's default.
"""),
    cfg.BoolOpt("placement_from_memory", default=True, help="""
(nova-scheduler) Answer the scheduler's GET /allocation_candidates from the
scheduler's copy of placement's resource providers (fed by the placement feed
through the stream) when that copy answers it exactly, and ask placement only
otherwise: a request outside the covered set (a resource class asked by
several groups under a group_policy other than none, or suffixed groups beside
an unsuffixed part only sharing providers serve), no feed yet, or a copy older
than the feed allows.
Each answer's source and each fallback's reason are counted
(shm_allocation_candidates_total). The claim still goes to placement, which
stays the arbiter; a claim it refuses has the providers concerned read back
from placement into the copy. On is safe without a feed: every request then
goes to placement, counted with reason no_feed (or no_view).

Related options: placement_randomize_allocation_candidates,
placement_max_allocation_candidates and
placement_optimize_for_wide_provider_trees must be placement's own values.
"""),
    cfg.FloatOpt("placement_fresh_wait", default=1.0, min=0.0, help="""
(nova-scheduler) Read-your-writes for the answers from memory: a request is
answered from the scheduler's copy of placement once that copy holds a poll
of the placement feed begun after the request arrived at nova's API (the
request context's timestamp), so a write to placement that returned before
the request was made (a host added to an aggregate, a trait, an inventory) is
in the answer, as in placement's own. The request waits at most this many
seconds for such a poll, then asks placement (counted with reason behind).
The wait is usually none: a request reaches the scheduler a poll interval or
more after it arrived. 0: ask placement whenever the copy has no such poll
yet. A feed that publishes no poll markers sets no bar.

Related options: [placement_feed] poll_interval (the feed's).
"""),
    cfg.BoolOpt("placement_randomize_allocation_candidates", default=False, help="""
(nova-scheduler) placement's [placement] randomize_allocation_candidates,
as placement.conf sets it. Answers from memory shuffle (or, with a limit,
sample) the candidates as placement does when it is set; set it to
placement's value or the answers from memory are ordered where placement's
are random.
"""),
    cfg.IntOpt("placement_max_allocation_candidates", default=-1, min=-1, help="""
(nova-scheduler) placement's [placement] max_allocation_candidates, as
placement.conf sets it: answers from memory stop at that many candidates
before the request's limit applies, as placement's do. -1: no maximum
(placement's default). Set it to placement's value.
"""),
    cfg.BoolOpt("placement_optimize_for_wide_provider_trees", default=False, help="""
(nova-scheduler) placement's [workarounds]
optimize_for_wide_provider_trees, as placement.conf sets it (it changes
placement's second capacity check, hence which providers are candidates).
Set it to placement's value.
"""),
    cfg.StrOpt("cell_uuid", help="""
(nova-compute) The uuid of the cell this compute belongs to, published in
every host document of this service. Find it with 'nova-manage cell_v2
list_cells'.
"""),
    cfg.BoolOpt("cell_streams", default=False, help="""
(nova-scheduler, nova-compute) A host-state stream per nova cell, found from
nova's cell mappings. A compute publishes on the stream of its cell_uuid
(required then), on its [data_plane] stream_url: its cell's broker. A
scheduler reads, at start, nova's cell mappings and the stream of every cell
but cell0, on [data_plane:<cell uuid>] stream_url if the stream's file sets
one, else on the cell mapping's transport_url; and it reaches each cell's
computes on [data_plane:<cell uuid>] transport_url, else on the mapping's
transport_url, where a compute of the cell listens with its [control_plane]
transport_url set to its cell's message queue. [data_plane] cells set in the
stream's file wins over the mappings.

Related options: cell_uuid, config_files ([data_plane] cell and cells).
"""),
    cfg.IntOpt("aggregate_refresh_interval", default=60, min=0, help="""
(nova-compute) Seconds between reads of this host's aggregates (one
AggregateList.get_by_host through the conductor), published in the
aggregates namespace. The scheduler also applies nova's update_aggregates
fanout at once; this is what makes aggregates survive a scheduler restart
without a database read. 0 disables it.
"""),
    cfg.FloatOpt("api_publish_timeout", default=2.0, min=0.0, help="""
(nova-api, nova-conductor) Seconds an API call that changes what schedulers
read (a service enabled, disabled, forced down or deleted; a compute node
deleted; an aggregate changed) waits for the change to be on the host-state
stream before it returns. A change not confirmed in time is logged and
published as soon as it can be; the call returns either way.

Possible values: 0 (return at once, publish in the background), or seconds.
"""),
    cfg.StrOpt("api_lock_dir", help="""
(nova-api, nova-conductor) Directory of the lock files that give each process
of a host a stable API-side source name: ``<[reporter] name>-api-<slot>`` in
nova-api, ``<[reporter] name>-conductor-<slot>`` in nova-conductor, the lowest
slot no other live process of the host holds. A restarted process takes its
slot again and publishes a new epoch of the same source, so restarts leave no
sources behind, and a signing key file can name each source in advance.

Possible values: a directory writable by the service user. Unset: the
reporter's state_dir if set, else the system's temporary directory.
"""),
]


def register_opts(conf: cfg.ConfigOpts) -> None:
    conf.register_opts(opts, group=GROUP)


def list_opts() -> list[tuple[str, list[cfg.Opt]]]:
    return [(GROUP, opts)]
