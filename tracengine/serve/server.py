"""The server's life: bind, serve with uvicorn, and on SIGINT or SIGTERM close
cleanly, in a bounded time. At the signal the listening socket closes, the
requests in flight are aborted (a streaming client gets finish_reason "abort"
and `[DONE]`, a waiting one a 503; the trace records a SeqAbort with reason
"shutdown"), a request whose body has not arrived gets a 503 without waiting
for it, the engine loop ends between steps, and the trace is closed (its end
frame) before any connection is waited for. A connection still open
SHUTDOWN_GRACE_S later is cut."""
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

# How long connections get to take their last bytes once the trace is closed; with the
# engine's last step before it, shutdown stays well inside Kubernetes' default grace of 30 s.
SHUTDOWN_GRACE_S = 10


class _Uvicorn(uvicorn.Server):

    def __init__(self, config: uvicorn.Config, app: "ServeApp"):
        super().__init__(config)
        self.app = app

    def handle_exit(self, sig, frame) -> None:
        # uvicorn raises a caught signal again once it has shut down; the server's
        # shutdown is complete and clean by then, so the command exits 0 instead
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True     # a second Ctrl-C: do not wait for connections
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        for server in self.servers:
            server.close()             # no new connections while the engine stops
        self.app.server.stopping.set()          # bodies still on their way: a 503 now
        self.app.server.preparer.close()        # bodies queued for the tokenizer: a 503
        await asyncio.to_thread(self.app.stop_engine)
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
    or not) is the caller's: the server ends its trace when it stops (stop_recording),
    and the caller closes it after."""

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
                                timeout_graceful_shutdown=SHUTDOWN_GRACE_S)
        self._uvicorn = _Uvicorn(config, self)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop_engine(self) -> None:
        """Abort what is in flight, end the engine loop, and close the trace: the
        requests served are on disk, ended, before any client is waited for."""
        self.engine_loop.shutdown(SHUTDOWN_GRACE_S)
        if not self.engine_loop.alive:    # a loop still in its step after the wait keeps the trace open
            self.llm.stop_recording()

    def run(self) -> None:
        """Serve in this (the main) thread until SIGINT or SIGTERM."""
        self.engine_loop.start()
        try:
            self._uvicorn.run(sockets=[self.socket])
        finally:
            self.stop_engine()
            self.socket.close()

    def start(self) -> "ServeApp":
        self.engine_loop.start()
        self._thread = threading.Thread(target=self._uvicorn.run, kwargs={"sockets": [self.socket]},
                                        name="tracengine-http", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 60) -> None:
        """As a signal would: abort what is in flight, close the socket, end the loop
        and the trace."""
        self._uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        self.stop_engine()
        self.socket.close()

    def __enter__(self) -> "ServeApp":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
