"""What the ingress knows of the engine replicas: the running ones its router sees, each with the
statistics it last reported (VoiceAffinityRouter polls them), and the router's voice-routing counts.

It backs /ready (replicas ready, total sequence slots), the cluster totals in /metrics, and the
per-replica metrics labelled `replica`.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from ..metrics import PREFIX
from .router_registry import RoutingCounts, router_for

# Per-replica gauges: (metric suffix, help, how to read it from the replica's stats)
_BYTES_PER_GB = 1e9
_REPLICA_GAUGES = (
    ("requests_waiting", "Requests waiting for this replica's engine.", lambda s: s.get("queue_depth")),
    ("requests_running", "Requests this replica's engine is generating.", lambda s: s.get("running")),
    ("sequence_slots", "Sequences this replica decodes at once (KV slots).", lambda s: s.get("slots")),
    ("sequence_slots_ready", "Sequences this replica can run at once now.", lambda s: s.get("slots_ready")),
    ("frames_per_second", "Decode speed of this replica's last request.", lambda s: s.get("frames_per_s")),
    ("memory_bytes", "Accelerator memory in use.", lambda s: (s.get("memory_gb") or 0) * _BYTES_PER_GB),
    ("voice_prefix_hits", "Requests whose voice prefix KV was reused.", lambda s: _nested(s, "prefix_cache", "hits")),
    ("voice_prefix_misses", "Requests whose voice prefix was prefilled.", lambda s: _nested(s, "prefix_cache", "misses")),
    ("reference_code_hits", "Reference clips whose codes were cached (memory or disk).",
     lambda s: _nested(s, "reference_cache", "memory_hits") + _nested(s, "reference_cache", "disk_hits")),
    ("reference_code_encodes", "Reference clips encoded by this replica's codec.",
     lambda s: _nested(s, "reference_cache", "misses")),
    ("engine_requests", "Requests this replica's engine finished.", lambda s: s.get("requests_total")),
    ("engine_audio_seconds", "Audio this replica's engine produced, in seconds.", lambda s: s.get("audio_seconds_total")),
)


def _nested(stats: dict, group: str, name: str) -> float:
    return (stats.get(group) or {}).get(name) or 0


class ClusterView:
    def __init__(self, deployment_name: str):
        self._deployment_name = deployment_name
        self._no_counts = RoutingCounts()

    def replicas(self) -> list[dict]:
        """Each running replica: its static metadata, overlaid by the statistics it last reported."""
        router = router_for(self._deployment_name)
        if router is None:
            return []
        running = list(router.curr_replicas.values())
        return sorted(({**(getattr(r, "replica_metadata", None) or {}), **(r.routing_stats or {}),
                        "replica": r.replica_id.unique_id} for r in running), key=lambda s: s["replica"])

    def routing_counts(self) -> dict[str, int]:
        router = router_for(self._deployment_name)
        return (router.counts if router is not None else self._no_counts).snapshot()

    def ready_report(self) -> dict:
        """/ready's cluster part: how many replicas run and what each holds."""
        replicas = self.replicas()
        return {
            "replicas_ready": len(replicas),
            "replicas": [{"replica": s["replica"], "host": s.get("host"), "pid": s.get("pid"), "device": s.get("device"),
                          "slots": s.get("slots"), "running": s.get("running"), "waiting": s.get("queue_depth")}
                         for s in replicas],
        }

    def totals(self) -> dict:
        """engine.stats()-shaped sums over the replicas, for the app's own gauges."""
        replicas = self.replicas()
        total = {name: sum(s.get(name) or 0 for s in replicas)
                 for name in ("queue_depth", "running", "slots", "slots_ready", "capacity", "memory_gb",
                              "peak_memory_gb", "frames_per_s")}
        total["prefix_cache"] = {"hits": sum(_nested(s, "prefix_cache", "hits") for s in replicas)}
        total["capturing"] = any(s.get("capturing") for s in replicas)
        for name in ("model", "device", "precision", "compile"):
            total[name] = ", ".join(sorted({str(s.get(name)) for s in replicas if s.get(name) is not None}))
        total["replicas"] = len(replicas)
        return total

    def collect(self):
        """prometheus_client collector: per-replica engine gauges and the voice-routing counts."""
        replicas = self.replicas()
        for suffix, description, read in _REPLICA_GAUGES:
            family = GaugeMetricFamily(f"{PREFIX}_replica_{suffix}", description, labels=["replica", "device"])
            for stats in replicas:
                family.add_metric([stats["replica"], str(stats.get("device"))], float(read(stats) or 0))
            yield family
        yield GaugeMetricFamily(f"{PREFIX}_replicas_ready", "Engine replicas running and taking requests.",
                                value=len(replicas))
        counts = self.routing_counts()
        routed = CounterMetricFamily(
            f"{PREFIX}_voice_routing", "Engine calls by routing outcome: hit (the voice's preferred replica), "
            "spill (it was saturated: the least-loaded replica), unkeyed (no voice: the least-loaded replica).",
            labels=["outcome"])
        routed.add_metric(["hit"], counts["hits"])
        routed.add_metric(["spill"], counts["spills"])
        routed.add_metric(["unkeyed"], counts["unkeyed"])
        yield routed
        keyed = counts["hits"] + counts["spills"]
        yield GaugeMetricFamily(f"{PREFIX}_voice_routing_hit_ratio",
                                "Share of voice requests routed to their voice's preferred replica.",
                                value=counts["hits"] / keyed if keyed else 0.0)
