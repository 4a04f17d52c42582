"""The extender's two verbs, ``predicate`` (filter) and ``prioritize``, for one configuration:
request bytes in, answer bytes out, by the rules of :mod:`topolvm.scheduler.extender` over the
nodes in the request or in the node cache. The HTTP server (:mod:`topolvm.scheduler.server`)
calls them; tests and the bench call them without HTTP."""

from __future__ import annotations

from dataclasses import dataclass, field

from topolvm.config.scheduler import SchedulerConfig, default_config
from topolvm.constants import Names, names
from topolvm.scheduler.extender import (
    BadRequest,
    HostPriority,
    annotation_lookup,
    decode_args,
    decode_node,
    decode_nodes,
    decode_raw_nodes,
    encode_filter_names,
    encode_filter_nodes,
    encode_priorities,
    filter_reason,
    node_score,
    requested_capacity,
    unknown_reason,
)
from topolvm.scheduler.nodecache import NodeCache


@dataclass
class Extender:
    """Filtering and scoring for one configuration; callable without HTTP (tests, bench)."""

    config: SchedulerConfig = field(default_factory=default_config)
    cache: NodeCache | None = None
    names: Names = field(default_factory=names)

    def divisor(self, dc: str) -> float:
        return self.config.divisors.get(dc, self.config.default_divisor)

    def _need_cache(self) -> NodeCache:
        if self.cache is None:
            raise BadRequest(
                "the request has NodeNames but no Nodes (kube-scheduler is configured with "
                "nodeCacheCapable: true), but this extender runs without a node cache: start it "
                "with --node-cache or set nodeCacheCapable: false"
            )
        return self.cache

    def predicate(self, body: bytes) -> bytes:
        args = decode_args(body)
        requested = requested_capacity(args.pod, self.names)
        failed: dict[str, str] = {}
        if args.nodes is not None:
            raws = decode_raw_nodes(args.nodes)
            if not requested:
                return encode_filter_nodes((), failed, whole=args.nodes)
            passing = []
            for i, raw in enumerate(raws):
                meta = decode_node(raw, i)
                lookup = annotation_lookup(meta.annotations, self.names)
                reason = filter_reason(lookup, requested, self.names)
                if reason is None:
                    passing.append(raw)
                else:
                    failed[meta.name] = reason
            return encode_filter_nodes(passing, failed)
        node_names = args.node_names or []
        cache = self._need_cache()
        if not requested:
            return encode_filter_names(node_names, failed)
        view = cache.view()
        if view.unsynced is not None:
            reason = unknown_reason(requested, view.unsynced)
            return encode_filter_names([], dict.fromkeys(node_names, reason))
        fitting, failed = view.filter(node_names, requested, self.names)
        return encode_filter_names(fitting, failed)

    def prioritize(self, body: bytes) -> bytes:
        args = decode_args(body)
        requested = requested_capacity(args.pod, self.names)
        if args.nodes is not None:
            metas = decode_nodes(args.nodes)
            if not requested:
                return encode_priorities(None)
            return encode_priorities(
                [
                    HostPriority(
                        m.name,
                        node_score(
                            annotation_lookup(m.annotations, self.names), requested, self.divisor
                        ),
                    )
                    for m in metas
                ]
            )
        cache = self._need_cache()
        if not requested:
            return encode_priorities(None)
        view = cache.view()
        node_names = args.node_names or []
        if view.unsynced is not None:
            return encode_priorities([HostPriority(n, 0) for n in node_names])
        # Unknown capacity cannot be ranked: 0, like a node without annotations.
        return view.priorities(node_names, tuple(requested))
