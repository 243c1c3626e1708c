"""An engine on another box, reached through its `sparkgate engine-host`.

To the gateway it is an engine like the in-process one: it takes token ids and
streams chunks, and it reports the KV spec that admission counts against. That
spec is the share of the remote pool this gateway claimed (policies/shares.py),
so several gateways reaching one engine cannot over-commit it together. Stats
are polled in the background (the poll also renews the claim); the model's
tokenizer is loaded locally, and checked against the host's before serving,
because token ids cross the wire.

Closing a stream closes its connection, which aborts the request on the host;
an explicit abort goes too, so the blocks free without waiting for the host to
notice the closed socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import httpx
import pydantic

from engine_adapter.base import (
    EngineChunk,
    EngineError,
    EngineOverloaded,
    EngineRequest,
    EngineRequestInvalid,
    EngineUnavailable,
)
from engine_adapter.hf_tokenizer import fingerprint, load_tokenizer
from engine_adapter.polled import PolledEngine
from engine_adapter.wire import PROTOCOL, Claim, EngineInfo, GenerateFrame, StatsFrame, StreamFrame

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class RemoteEngineConfig:
    name: str  # the model's name on the host
    address: str  # the host's base URL, e.g. http://spark-2:8001
    token: str = field(repr=False)  # shared with the host; never in a repr or a log
    tokenizer: str  # a local directory with the model's tokenizer
    share: float = 1.0  # of the host's KV pool and slots, for this gateway
    poll_interval_s: float = 0.5
    connect_timeout_s: float = 5.0
    # The host sends an empty line every second while a stream is quiet (a long prefill):
    # silence this long means the host or the network stalled.
    read_timeout_s: float = 10.0
    gateway_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    @property
    def shown_address(self) -> str:
        """The address for messages and logs: credentials in it shown as *** (errors reach
        clients). As gateway.redaction.redacted_url, which engine_adapter may not import."""
        url = httpx.URL(self.address)
        return str(url.copy_with(userinfo=b"***")) if url.userinfo else self.address


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase


def _refused(response: httpx.Response, where: str) -> EngineError:
    """A host's refusal of a generate call: the client's error (400), the host's box out of
    memory for now (503 `server_overloaded`: the gateway answers overloaded, with the host's
    Retry-After), or the engine unavailable."""
    if response.status_code == 400:
        return EngineRequestInvalid(_message(response))
    message = f"{where}: HTTP {response.status_code}: {_message(response)}"
    try:
        code = response.json()["error"]["code"]
    except (ValueError, KeyError, TypeError):
        code = None
    if response.status_code == 503 and code == "server_overloaded":
        try:
            retry: float | None = float(response.headers["Retry-After"])
        except (KeyError, ValueError):
            retry = None
        return EngineOverloaded(message, retry)
    return EngineUnavailable(message)


class RemoteEngine(PolledEngine):
    """One model on another box, claimed by this gateway for a share of its engine."""

    def __init__(self, config: RemoteEngineConfig) -> None:
        self._streams: set[str] = set()  # requests streaming from the host now
        super().__init__(config.name)
        self.config = config
        self._info: EngineInfo | None = None

    # -- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        c = self.config
        # httpx logs every request at INFO: one line per stats poll would drown the gateway's log.
        logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger("httpx").level))
        self._client = httpx.AsyncClient(
            base_url=c.address.rstrip("/") + f"/engine/v1/{c.name}",
            # Every call names this gateway: the host keys claims and request ids by it.
            headers={
                "Authorization": f"Bearer {c.token}",
                "X-Sparkgate-Gateway": c.gateway_id,
                "Content-Type": "application/json",
            },
            timeout=httpx.Timeout(c.connect_timeout_s, read=c.read_timeout_s),
        )
        self._tokenizer = await asyncio.to_thread(load_tokenizer, c.tokenizer)
        info = await self._claim()
        if info.protocol != PROTOCOL:
            raise EngineUnavailable(
                f"engine host {c.shown_address} speaks protocol {info.protocol}, this gateway {PROTOCOL}"
            )
        local = await asyncio.to_thread(fingerprint, self._tokenizer)
        if info.tokenizer_fingerprint != local:
            raise EngineUnavailable(
                f"engine {c.name} on {c.shown_address}: its tokenizer differs from {c.tokenizer} here "
                f"({info.tokenizer_fingerprint} != {local}); token counts and ids would be wrong"
            )
        self._poller = asyncio.create_task(self._poll(), name=f"poll-{c.name}")
        spec = info.kv_spec
        log.info(
            "engine %s on %s: claimed %.3g: %d of %d blocks x %d tokens, %d slots",
            c.name,
            c.shown_address,
            c.share,
            spec.usable_blocks,
            info.pool_blocks,
            spec.block_size,
            spec.max_num_seqs,
        )

    async def _claim(self) -> EngineInfo:
        c = self.config
        try:
            r = await self._http.post("/claim", content=Claim(share=c.share).model_dump_json())
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"engine host {c.shown_address} unreachable: {e!r}") from e
        if r.status_code != 200:
            raise EngineUnavailable(f"engine host {c.shown_address} refused the claim on {c.name}: {_message(r)}")
        info = EngineInfo.model_validate_json(r.content)
        if self._info is not None and info.kv_spec != self._info.kv_spec:
            # Admission was sized from the first grant; a different one means the host restarted
            # with other settings. Serving on would count against blocks that are not there.
            raise EngineUnavailable(f"engine {c.name} on {c.shown_address} came back with another KV pool")
        self._info, self._spec = info, info.kv_spec
        self._healthy = info.healthy
        return info

    async def _poll(self) -> None:
        """Stats and the claim's renewal; a lapsed claim is made again (the host may have restarted)."""
        c = self.config
        while True:
            await asyncio.sleep(c.poll_interval_s)
            try:
                r = await self._http.get("/stats")
                if r.status_code == 409:
                    await self._claim()
                    continue
                if r.status_code != 200:
                    raise EngineUnavailable(f"stats: HTTP {r.status_code}: {_message(r)}")
                frame = StatsFrame.model_validate_json(r.content)
                self._stats, self._healthy = frame.stats, frame.healthy
            except (httpx.HTTPError, EngineUnavailable, pydantic.ValidationError) as e:
                if self._healthy:
                    log.warning("engine %s on %s unavailable: %s", c.name, c.shown_address, e)
                self._healthy = False

    async def shutdown(self) -> None:
        await self._stop_polling()
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(httpx.HTTPError):
                await client.delete("/claim", timeout=2.0)
            await client.aclose()

    # -- requests -----------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineChunk]:
        c = self.config
        if not self.is_healthy:
            raise EngineUnavailable(f"engine {c.name} on {c.shown_address} is not available")
        body = GenerateFrame(request=request).model_dump_json()
        finished = False
        self._streams.add(request.request_id)
        try:
            async with self._http.stream("POST", "/generate", content=body) as r:
                if r.status_code != 200:
                    await r.aread()
                    raise _refused(r, f"engine {c.name} on {c.shown_address}")
                async for line in r.aiter_lines():
                    if not line:
                        continue
                    frame = StreamFrame.model_validate_json(line)
                    if frame.error == "invalid":
                        raise EngineRequestInvalid(frame.message)
                    if frame.error is not None or frame.chunk is None:
                        raise EngineUnavailable(f"engine {c.name} on {c.shown_address}: {frame.message}")
                    finished = frame.chunk.finished
                    yield frame.chunk
                    if finished:
                        return
            raise EngineUnavailable(
                f"engine {c.name} on {c.shown_address} ended the stream before the request finished"
            )
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"engine {c.name} on {c.shown_address} failed mid-request: {e!r}") from e
        except pydantic.ValidationError as e:
            raise EngineUnavailable(f"engine {c.name} on {c.shown_address} sent a malformed frame: {e}") from e
        finally:
            self._streams.discard(request.request_id)
            if not finished:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.abort(request.request_id))

    async def abort(self, request_id: str) -> None:
        if self._client is None:
            return
        with contextlib.suppress(httpx.HTTPError):
            await self._client.post(f"/abort/{request_id}", timeout=2.0)
