"""`mp-rewrite view MODEL`: Google's Model Explorer on 127.0.0.1 with the model and the rewrite's colors as node
data (the overlay of `inspect --format model-explorer`). Needs the `viz` extra; runs until Ctrl+C or SIGTERM.

An inherited SIGINT disposition is kept, as Python and Unix programs keep it: a shell without job control (a
script) starts background jobs with SIGINT ignored so that Ctrl+C at the terminal leaves them running; an
interactive shell's `mp-rewrite view &` is in its own process group with SIGINT at its default and stops on
`kill -INT %1`. A script stops its background viewer with SIGTERM (exit 143)."""

from __future__ import annotations

import signal
import socket
import threading

from ..errors import OptionError
from .inspect import add_model_options, check_model_path, load_and_rewrite

HOST = "127.0.0.1"
FIRST_PORT, LAST_PORT = 8080, 8099  # where Model Explorer itself looks for a free port


def register(sub) -> None:
    """Add the `view` subcommand."""
    p = sub.add_parser("view", help="open the model in Model Explorer, colored by the rewrite (viz extra)",
                       description="Rewrite MODEL and serve Google's Model Explorer on 127.0.0.1 with the model and "
                                   "the rewrite's decisions as node data (colors as in the SVG/HTML pictures, "
                                   "values like 'bfloat16 (allow: allow list)'). Prints the URL and serves until "
                                   "Ctrl+C or SIGTERM (kill PID: a script's background job has Ctrl+C ignored, "
                                   "as POSIX shells start them); no browser is opened unless --open is given "
                                   "(headless machines). "
                                   "Needs pip install 'mp_rewrite[viz]'.")
    add_model_options(p)
    p.add_argument("--port", type=int, metavar="N",
                   help=f"port on {HOST} (default: the first free one from {FIRST_PORT} to {LAST_PORT}, as Model "
                        "Explorer does; 0: any free port)")
    p.add_argument("--open", action="store_true", help="also open the page in a web browser")
    p.set_defaults(func=run, precheck=check_view_args)


def check_view_args(args) -> None:
    """Before TensorFlow starts: MODEL exists, Model Explorer is installed, the port is free; picks the port."""
    from ..report.model_explorer import require_installed
    check_model_path(args)
    require_installed()
    args.port = choose_port(args.port)


def _in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return True
    return False


def choose_port(port: int | None) -> int:
    """The port to serve on: `port` if free, any free port for 0, else the first free one of 8080-8099 (then any).

    Raises:
        OptionError: `port` is out of range or in use.
    """
    if port is None:
        free = next((p for p in range(FIRST_PORT, LAST_PORT + 1) if not _in_use(p)), 0)
        return free or choose_port(0)
    if not 0 <= port <= 65535:
        raise OptionError(f"--port must be between 0 and 65535, got {port}")
    if port == 0:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((HOST, 0))
            return s.getsockname()[1]
    if _in_use(port):
        raise OptionError(f"port {port} on {HOST} is in use; give another --port, or --port 0 for any free one")
    return port


def _without_version_check(server) -> None:
    """Model Explorer asks PyPI and GitHub for a newer release when it starts (and when the page asks); a local
    viewer of a local model has no reason to, and offline machines would wait on it. Answer "no news" instead."""
    if hasattr(server, "_check_new_version"):
        server._check_new_version = lambda print_msg=True: {"version": "", "runningVersion": "", "releaseUrl": "",
                                                            "desktopAppUrl": ""}


def _serve(server, config, port: int, open_browser: bool) -> None:
    """Run Model Explorer's server until Ctrl+C or SIGTERM. Its loop takes any KeyboardInterrupt as Ctrl+C and
    returns normally; a SIGTERM is noted and raised again afterwards, so that the CLI exits 143 as for any command."""
    from .cli import Terminated
    terminated = []

    def on_sigterm(signum, frame):
        terminated.append(signum)
        raise Terminated()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, on_sigterm) if main else None
    try:
        server.start(host=HOST, port=port, config=config, no_open_in_browser=not open_browser)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
    if terminated:
        raise Terminated()


def _add_model(config, overlay, model_path: str) -> None:
    """Open Model Explorer on the graph holding the network: a SavedModel's graphs go in as converted graphs with
    that one first (report.model_explorer.network_first); a model whose network is its main graph, by path."""
    if overlay.network == "main" or not overlay.collections:
        config.add_model_from_path(overlay.source.path, adapterId=overlay.source.adapter)
        return
    import os
    from ..report.model_explorer import network_first
    label = os.path.basename(os.path.normpath(model_path)) or "model"
    config.graphs_list.append(network_first(overlay.collections, overlay.network, label))
    config.model_sources.append({"url": f"graphs://{label}/{len(config.graphs_list) - 1}"})


def run(args) -> int:
    """Rewrite the model, build the overlay and serve Model Explorer until interrupted (exit 0 on Ctrl+C)."""
    from model_explorer import config as explorer_config, server
    from ..report.model_explorer import to_model_explorer
    model, result = load_and_rewrite(args)
    overlay = to_model_explorer(result, model, args.function, quiet=not args.verbose)
    config = explorer_config()
    _add_model(config, overlay, args.model)
    config.add_node_data(f"mp-rewrite {args.precision}", overlay.to_json(indent=None))
    print(f"mp-rewrite view: {overlay.summary()}; opens on graph '{overlay.network}'", flush=True)
    _without_version_check(server)
    _serve(server, config, args.port, args.open)
    return 0
