"""The smart plug of a simulated node: an HTTP server speaking a Shelly Gen2 plug's RPC, so
that the controller reads the node at the wall as it reads a real plug
(thermab.telemetry.wall_meters, kind ``shelly``).

``GET /rpc/Switch.GetStatus?id=0`` answers as a Shelly Plus Plug S does: ``apower`` (W, to
0.1 W) and ``aenergy.total`` (Wh, to 1 mWh, counted from the daemon's start).  The reading
is the node's modelled power through its power supply plus a fixed base
(:data:`thermab.sim.power_meters.PSU_EFFICIENCY`, :data:`~thermab.sim.power_meters.WALL_BASE_W`), which
the thermal daemon's power meter keeps.  The server runs on a thread of the thermal daemon,
on a free port of 127.0.0.1, whose URL it writes to ``ROOT/run/plug.url``, where the
controller's poller finds it."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from thermab.sim import node
from thermab.telemetry.wall_meters import SIM_PLUG_FILE


def switch_status(channel: int, watts: float, energy_wh: float) -> dict:
    """``Switch.GetStatus``'s answer, with the fields a Shelly Gen2 switch reports."""
    return {
        "id": channel,
        "source": "init",
        "output": True,
        "apower": round(watts, 1),
        "voltage": 230.0,
        "current": round(watts / 230.0, 3),
        "aenergy": {"total": round(energy_wh, 3), "by_minute": [0.0, 0.0, 0.0], "minute_ts": 0},
        "temperature": {"tC": 40.0, "tF": 104.0},
    }


def serve(root: Path, meter) -> ThreadingHTTPServer:
    """Start the plug of the node at ``root`` on a daemon thread; ``meter`` is its
    thermab.sim.power_meters.PowerMeter (``wall_w``, ``wall_wh``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query)
            if url.path != "/rpc/Switch.GetStatus" or query.get("id", ["0"]) != ["0"]:
                self.send_error(404, "no such method or channel")
                return
            body = json.dumps(switch_status(0, meter.wall_w, meter.wall_wh)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):  # a request a second: not for the daemon's log
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="plug", daemon=True).start()
    node.write_atomic(Path(root) / SIM_PLUG_FILE, "http://127.0.0.1:%d\n" % server.server_address[1])
    return server
