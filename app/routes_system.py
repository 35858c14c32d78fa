"""Liveness, readiness and Prometheus metrics.

All answer on the event loop, from memory: none waits for a thread that generation work could hold.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends
from starlette.concurrency import run_in_threadpool
from starlette.responses import PlainTextResponse, Response

from .errors import HTTPProblem, error_responses, retry_after
from .metrics import Metrics


def build_router(engine, metrics: Metrics, guard, replicas=None) -> APIRouter:
    """`replicas` (a cluster's ClusterView, else None) adds the engine replicas to /ready."""
    router = APIRouter(tags=["system"])

    # Open to everyone, as load balancers and RunPod's proxy probe it without a key;
    # /v1/health is the reference server's path for the same answer. HEAD wherever GET is: probes
    # such as `curl -I` send it.
    @router.get("/health", summary="The process is alive", operation_id="health")
    @router.post("/health", summary="The process is alive", operation_id="health_post")
    @router.api_route("/health", methods=["HEAD"], include_in_schema=False)
    @router.api_route("/v1/health", methods=["GET", "POST", "HEAD"], include_in_schema=False)
    async def health():
        return {"status": "ok"}

    @router.get("/ready", summary="The model is loaded and warm", dependencies=[Depends(guard)],
                responses=error_responses(503))
    @router.api_route("/ready", methods=["HEAD"], dependencies=[Depends(guard)], include_in_schema=False)
    async def ready():
        if engine.is_ready:
            # Sequences that can run at once now, and once the larger batches' graphs are captured.
            answer = {"status": "ready", "slots_ready": engine.slots_ready, "slots": engine.slots,
                      "capturing": engine.capturing}
            return answer if replicas is None else {**answer, **await run_in_threadpool(replicas.ready_report)}
        if replicas is not None:
            raise HTTPProblem(503, "no engine replica is running yet: they are starting or being replaced",
                              retry_after(5))
        raise HTTPProblem(503, "the model is still loading or warming up", retry_after(5))

    @router.get("/metrics", summary="Prometheus metrics", dependencies=[Depends(guard)],
                response_class=PlainTextResponse)
    @router.api_route("/metrics", methods=["HEAD"], dependencies=[Depends(guard)], include_in_schema=False)
    async def prometheus():
        body, content_type = metrics.render(engine)  # counters and engine.stats(): no I/O
        return Response(body, media_type=content_type)

    return router
