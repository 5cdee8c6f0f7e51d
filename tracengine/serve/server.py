"""The server's life: bind, serve with uvicorn, and on SIGINT or SIGTERM close
cleanly. At the signal the listening socket closes, the requests in flight
are aborted (a streaming client gets finish_reason "abort" and `[DONE]`, a
waiting one a 503; the trace records a SeqAbort with reason "shutdown"), the
engine loop ends between steps, and the trace gets its end frame."""
import asyncio
import signal
import socket
import threading

import uvicorn

from tracengine.errors import TracengineError
from tracengine.serve.app import Server, build_app
from tracengine.serve.engine_loop import EngineLoop
from tracengine.serve.metrics import ServerMetrics
from tracengine.serve.protocol import MAX_BODY_BYTES


class _Uvicorn(uvicorn.Server):

    def __init__(self, config: uvicorn.Config, engine_loop: EngineLoop):
        super().__init__(config)
        self.engine_loop = engine_loop

    def handle_exit(self, sig, frame) -> None:
        # uvicorn raises a caught signal again once it has shut down; the server's
        # shutdown is complete and clean by then, so the command exits 0 instead
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True     # a second Ctrl-C: do not wait for connections
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()             # no new connections while the engine stops
        await asyncio.to_thread(self.engine_loop.shutdown)
        await super().shutdown(sockets)


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        raise TracengineError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


class ServeApp:
    """An engine behind HTTP: `run()` serves until a signal (the CLI); `start()` and
    `stop()` serve from a thread (tests, benchmarks). The engine (an `LLM`, recording
    or not) is the caller's: close it after the server stops, which ends the trace."""

    def __init__(self, llm, host: str = "127.0.0.1", port: int = 8000, model_name: str = "embedded",
                 api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES):
        self.llm = llm
        self.metrics = ServerMetrics(model_name, llm.config.num_kvcache_blocks)
        self.metrics.start_ns = llm.start_ns
        self.engine_loop = EngineLoop(llm, self.metrics)
        self.server = Server(llm, self.engine_loop, self.metrics, model_name, api_key, max_body_bytes)
        self.socket = bind(host, port)
        self.host, self.port = host, self.socket.getsockname()[1]
        config = uvicorn.Config(build_app(self.server), lifespan="off", log_level="warning", access_log=False,
                                timeout_graceful_shutdown=30)
        self._uvicorn = _Uvicorn(config, self.engine_loop)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        """Serve in this (the main) thread until SIGINT or SIGTERM."""
        self.engine_loop.start()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.engine_loop.shutdown()
            self.socket.close()

    def start(self) -> "ServeApp":
        self.engine_loop.start()
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self.socket]},
                                        name="tracengine-http", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60) -> None:
        """As a signal would: abort what is in flight, close the socket, end the loop."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.engine_loop.shutdown(timeout)
        self.socket.close()

    def __enter__(self) -> "ServeApp":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
