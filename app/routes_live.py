"""WebSocket /v1/tts/live: Fish Audio's live TTS session, for agents that speak text as it is written.

Messages are msgpack maps in binary frames, as the Fish Audio SDKs send and read them:
client -> server `{"event": "start", "request": {TTS request fields, text ""}}` once, then any number
of `{"event": "text", "text": "..."}` and `{"event": "flush"}`, then `{"event": "stop"}`;
server -> client `{"event": "audio", "audio": bytes}` as audio is produced, then
`{"event": "finish", "reason": "stop"}` (or `"error"` with a `message`).

Text is spoken as soon as a sentence is complete (or at a flush, or at stop), so the first audio
comes while the client is still sending text. The whole session is one audio stream in the
request's format (one WAV header, one MP3 stream, ...).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import re

import ormsgpack
from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from engine.audio_stream import encode_stream
from engine.text.splitter import split_text

from .api_schema import TTSRequest
from .auth import ApiKeyGuard
from .body import describe
from .bridge import iterate_in_thread
from .errors import HTTPProblem, problem_for
from .speech import SpeechService, StreamStats, Voice

log = logging.getLogger("app")

# The end of a sentence: Latin terminal punctuation followed by whitespace or the end of the text
# (not the dot in 2.5), or CJK terminal punctuation, which no space follows.
_SENTENCE_END = re.compile(r"[.!?;…]+[\"')\]]*(?=\s|$)|[。！？；]+")
_END = None  # the segments queue's end marker


def within_limit(text: str, limit: int) -> list[str]:
    """`text` in pieces of at most `limit` characters (0: no limit), cut as the engine cuts long
    texts into chunks: after sentences, else clauses, else words."""
    if limit:
        return split_text(text, limit)
    return [text.strip()] if text.strip() else []


def split_complete(buffer: str, chunk_length: int) -> tuple[str, str]:
    """(text ready to speak, text to keep waiting for more): up to the last sentence end, or up to
    the last space once the buffer is longer than a chunk without one."""
    ends = [m.end() for m in _SENTENCE_END.finditer(buffer)]
    if ends:
        return buffer[: ends[-1]], buffer[ends[-1]:]
    if len(buffer) > chunk_length and " " in buffer.strip():
        cut = buffer.rstrip().rfind(" ")
        return buffer[:cut], buffer[cut:]
    return "", buffer


def build_router(synth: SpeechService, guard: ApiKeyGuard) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["speech"])

    @router.get("/tts/live", include_in_schema=False)
    async def live_over_http():
        # A client that forgot the upgrade would otherwise get 404, which reads like a wrong base URL.
        raise HTTPProblem(426, "/v1/tts/live is a WebSocket: connect with ws:// (wss:// behind TLS), as Fish Audio's "
                          "SDK does with its TTS live session", {"Upgrade": "websocket", "Connection": "Upgrade"})

    @router.websocket("/tts/live")
    async def live(ws: WebSocket):
        try:
            await guard(ws)
        except HTTPProblem as problem:
            await ws.close(code=1008, reason=problem.message[:120])
            return
        await ws.accept()
        try:
            request = await _start(ws)
        except (ValueError, HTTPProblem) as e:
            await _finish_with_error(ws, str(e))
            return
        except WebSocketDisconnect:
            return
        await LiveSession(synth, ws, request).run()

    return router


async def _start(ws: WebSocket) -> TTSRequest:
    message = await _receive_map(ws)
    if message.get("event") != "start" or not isinstance(message.get("request"), dict):
        raise HTTPProblem(400, 'the first message must be {"event": "start", "request": {...}}')
    try:
        return TTSRequest.model_validate({**message["request"], "text": ""})
    except ValidationError as e:
        raise HTTPProblem(400, describe(e.errors())) from None


async def _receive_map(ws: WebSocket) -> dict:
    """The next message; a text frame is the client's error, as is a binary one that is not a map."""
    message = await ws.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000), message.get("reason"))
    if message.get("bytes") is None:
        raise HTTPProblem(400, "messages must be msgpack maps in binary frames, got a text frame")
    return _unpack(message["bytes"])


def _unpack(data: bytes) -> dict:
    try:
        message = ormsgpack.unpackb(data)
    except (ormsgpack.MsgpackDecodeError, ValueError):
        raise HTTPProblem(400, "messages must be msgpack maps in binary frames") from None
    if not isinstance(message, dict):
        raise HTTPProblem(400, "messages must be msgpack maps with an `event`")
    return message


async def _finish_with_error(ws: WebSocket, message: str):
    try:
        await ws.send_bytes(ormsgpack.packb({"event": "finish", "reason": "error", "message": message}))
        await ws.close(code=1011 if message.startswith("internal") else 1008)
    except (WebSocketDisconnect, RuntimeError):
        pass


class LiveSession:
    def __init__(self, synth: SpeechService, ws: WebSocket, request: TTSRequest):
        self.synth, self.ws, self.request = synth, ws, request
        self.voice, self.params = Voice.of(request), request.sampling_params()
        self.spec = request.output_spec(request.format)
        self.segments: queue.SimpleQueue = queue.SimpleQueue()  # read by the stream thread
        self.buffer = ""

    async def run(self):
        receiver = asyncio.create_task(self._receive())
        try:
            async for data in iterate_in_thread(self._encoded):
                await self.ws.send_bytes(ormsgpack.packb({"event": "audio", "audio": data}))
            await receiver  # raises what the client's messages got wrong
            await self.ws.send_bytes(ormsgpack.packb({"event": "finish", "reason": "stop"}))
            await self.ws.close()
        except WebSocketDisconnect:
            pass
        except Exception as e:  # noqa: BLE001 - one session's failure is told to its client, never the server's
            await _finish_with_error(self.ws, problem_for(e).message)
        finally:
            receiver.cancel()
            self.segments.put(_END)

    def _encoded(self):
        return encode_stream(self._engine_chunks(), self.synth.sample_rate, self.spec)

    def _engine_chunks(self):
        """On the stream thread: each complete segment's audio, in order, until the session ends."""
        while (text := self.segments.get()) is not _END:
            yield from self.synth.stream(text, self.voice, self.params, StreamStats(self.synth.sample_rate))

    async def _receive(self):
        try:
            while True:
                message = await _receive_map(self.ws)
                event = message.get("event")
                if event == "text":
                    if not isinstance(message.get("text"), str):
                        raise HTTPProblem(400, 'a text event carries {"text": "..."}')
                    self.buffer += message["text"]
                    ready, self.buffer = split_complete(self.buffer, self.request.chunk_length)
                    self._speak(ready)
                elif event == "flush":
                    self._speak(self.buffer)
                    self.buffer = ""
                elif event == "stop":
                    self._speak(self.buffer)
                    return
                else:
                    raise HTTPProblem(400, f"unknown event {event!r}; send text, flush or stop")
        finally:
            self.segments.put(_END)

    def _speak(self, text: str):
        # A segment is one engine request: a long text event is cut to the server's limit.
        for piece in within_limit(text, self.synth.max_text_length):
            self.segments.put(piece)
