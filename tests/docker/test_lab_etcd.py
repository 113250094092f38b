"""Docker tier: the lab's etcd (``lab.engine.etcd``) as a stranger on the run's network finds
it -- three members in three containers, mutual TLS -- and as the job's own processes use it.

The stranger runs in a node of the run (so it reaches every member's client and peer port),
without reading the job's client certificate: the TLS handshake on each port must fail, so not
one key can be read or written. The same node with the certificate reads and writes.
Run with ``pytest -m docker tests/docker/test_lab_etcd.py``."""

from __future__ import annotations

import pytest

from lab.engine.cluster import Cluster
from lab.engine.etcd import CLIENT_PORT, PEER_PORT, lab_etcd
from lab.engine.layout import Layout
from lab.engine.specs import LABEL
from tests.helpers import leftovers

pytestmark = pytest.mark.docker

# Without a client certificate: the handshake (etcd requires one) or, if a server ever let it
# through, the request itself. It prints what happened on every port.
_STRANGER = """
import socket, ssl, sys
ca = "/run/ddp-etcd/client/ca.pem"  # the CA is no secret: it only checks the server
for host in sys.argv[2:]:
    for port in map(int, sys.argv[1].split(",")):
        ctx = ssl.create_default_context(cafile=ca)
        ctx.check_hostname = False
        try:
            with socket.create_connection((host, port), timeout=5) as raw:
                with ctx.wrap_socket(raw) as s:
                    s.sendall(b'POST /v3/kv/put HTTP/1.1\\r\\nHost: x\\r\\nContent-Length: 32\\r\\n'
                              b'\\r\\n{"key": "L2RkcA==", "value": "eA=="}')
                    print(host, port, "ANSWERED", s.recv(200))
        except (ssl.SSLError, ConnectionError, OSError) as e:
            print(host, port, "refused", type(e).__name__)
"""

_MEMBER = """
from ddp.recovery.etcd.client import Credentials, Etcd
c = Etcd(Credentials.from_env(), timeout_s=5)
c.put("/ddp/lab-test", b"mine")
print("read back", c.get("/ddp/lab-test").value.decode())
"""


@pytest.mark.timeout(300)
def test_a_stranger_on_the_run_network_gets_no_session(client, tmp_path):
    with Cluster(client, Layout(4, 1), run_dir=tmp_path, lifetime_s=300) as cluster:
        run_id = cluster.run_id
        with lab_etcd(cluster, (1, 2, 3), 240) as etcd:
            hosts = [cluster.address(n) for n in etcd.nodes]
            code, out = cluster.exec(
                0, ["python", "-c", _STRANGER, f"{CLIENT_PORT},{PEER_PORT}", *hosts]
            )
            assert code == 0, out
            lines = out.strip().splitlines()
            assert len(lines) == 6 and all(" refused " in line for line in lines), out
            code, out = cluster.exec(0, ["python", "-c", _MEMBER], env=etcd.env)
            assert code == 0 and "read back mine" in out, out
    assert leftovers(client, f"{LABEL}={run_id}") == []
