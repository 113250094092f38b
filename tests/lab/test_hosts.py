"""--hosts and --placement as pure logic, and their refusals on the command line: one line,
exit 2, before any container exists."""

from types import SimpleNamespace

import docker.errors
import pytest

from lab.cli import main
from lab.engine.client import ImageMissing
from lab.engine.distribute import hosts_arg, require_same_image
from lab.engine.hosts import LOCAL, Host, HostSet, parse_hosts, parse_placement
from lab.engine.specs import overlay_spec
from lab.shaping.across import pairs

H0, H1, H2 = (f"unix:///var/run/docker-host{k}.sock" for k in range(3))


def test_no_hosts_is_the_local_engine_alone():
    assert parse_hosts(None) == (Host(LOCAL),)
    assert parse_hosts("") == (Host(LOCAL),)
    assert not HostSet().several


def test_a_list_names_the_hosts_in_order_with_their_addresses():
    hosts = parse_hosts(f"{H0}=10.77.1.1,{H1},ssh://lab@10.0.0.3")
    assert [h.name for h in hosts] == ["host0", "host1", "host2"]
    assert [h.endpoint for h in hosts] == [H0, H1, "ssh://lab@10.0.0.3"]
    assert [h.address for h in hosts] == ["10.77.1.1", None, None]
    assert hosts_arg(hosts) == f"{H0}=10.77.1.1,{H1},ssh://lab@10.0.0.3"


def test_a_hosts_file_has_one_engine_a_line_with_comments(tmp_path):
    path = tmp_path / "hosts"
    path.write_text(
        f"# the lab's engines\n{H0} 10.77.1.1\n\n{H1}   # second\ntcp://10.0.0.2:2375\n"
    )
    hosts = parse_hosts(str(path))
    assert [(h.endpoint, h.address) for h in hosts] == [
        (H0, "10.77.1.1"),
        (H1, None),
        ("tcp://10.0.0.2:2375", None),
    ]


def test_round_robin_and_explicit_placement():
    hosts = parse_hosts(f"{H0},{H1},{H2}")
    assert HostSet(hosts).layout(5) == [0, 1, 2, 0, 1]
    placed = HostSet(hosts, parse_placement("host0,2,host2", hosts))
    assert placed.layout(3) == [0, 2, 2]
    assert placed.describe(3) == "node0 host0, node1 host2, node2 host2"
    assert HostSet(hosts).host_of(4, 5) == 1


@pytest.mark.parametrize(
    ("hosts", "placement", "nodes", "message"),
    [
        (f"{H0},{H1},{H0}", None, 3, f"{H0} is given twice (host0 and host2)"),
        ("notaurl", None, 3, "neither a hosts file nor a list of Docker endpoints"),
        (f"{H0},,{H1}", None, 3, "empty entry between commas"),
        ("http://x:1", None, 3, "is not a Docker endpoint"),
        (f"{H0}=somewhere", None, 3, "must be an IP address"),
        (f"{H0},{H1}", "host0,host2,host3", 3, "names host2, host3 but --hosts gives 2"),
        (f"{H0},{H1}", "0,1", 3, "--placement gives 2 node(s) a host but the run has 3 nodes"),
        (f"{H0},{H1}", "0,one", 2, "--placement: 'one' is not a host"),
    ],
)
def test_bad_hosts_are_refused(hosts, placement, nodes, message):
    with pytest.raises(ValueError, match="--") as e:
        parsed = parse_hosts(hosts)
        HostSet(parsed, parse_placement(placement, parsed)).layout(nodes)
    assert message in str(e.value)


def test_the_overlay_network_is_attachable_and_labelled():
    spec = overlay_spec("20260101-000000-abcd")
    assert spec["driver"] == "overlay" and spec["attachable"] is True
    assert spec["labels"] == {"lab.run": "20260101-000000-abcd"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (f"up --nodes 2 --hosts {H0},{H0}", "is given twice"),
        (f"up --nodes 4 --hosts {H0},{H1} --placement 0,1,2,2", "--placement names host2"),
        (f"up --nodes 4 --hosts {H0},{H1} --placement 0,1,1", "one host per node"),
        ("up --hosts unix:///nonexistent/docker.sock", "cannot reach the Docker engine"),
        ("latency --quick --hosts unix:///nonexistent/docker.sock", "drop it from --hosts"),
        ("image --no-build --hosts unix:///nonexistent/docker.sock", "cannot reach"),
    ],
)
def test_the_command_line_refuses_bad_hosts_in_one_line(argv, message, capsys):
    assert main(argv.split()) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_the_probe_pairs_one_link_across_hosts_and_one_within():
    assert pairs(["host0", "host1", "host2", "host0"]) == ((0, 1), (0, 3))
    assert pairs(["host0", "host1", "host2"]) == ((0, 1), None)
    assert pairs(["host0", "host0"]) == (None, (0, 1))


class _Image:
    def __init__(self, id_):
        self.id = id_


class _Images:
    def __init__(self, ids):
        self.ids = ids

    def get(self, name):
        if name not in self.ids:
            raise docker.errors.ImageNotFound(name)
        return _Image(self.ids[name])


def _engine(**ids):
    return SimpleNamespace(images=_Images(ids))


def test_a_missing_or_stale_image_names_the_host_and_the_fix():
    good = "sha256:" + "a" * 64
    members = [(Host(H0, name="host0"), _engine(img=good)), (Host(H1, name="host1"), _engine())]
    with pytest.raises(
        ImageMissing,
        match=r"host1 \(.*docker-host1.sock\) has no image img; "
        r"copy it there: python -m lab image --no-build --tag img --hosts ",
    ):
        require_same_image(members, "img")
    members[1] = (Host(H1, name="host1"), _engine(img="sha256:" + "b" * 64))
    with pytest.raises(ImageMissing, match=r"host1 .* has a stale img"):
        require_same_image(members, "img")
    members[1] = (Host(H1, name="host1"), _engine(img=good))
    assert require_same_image(members, "img") == good


def test_resuming_from_checkpoints_across_hosts_is_no_longer_refused(capsys):
    """ddp agrees over the process group on the newest checkpoint any rank sees and its holder
    broadcasts it, so --recover across hosts gets past the checks to the engines (here: none
    answers at these sockets, the one-line refusal that follows)."""
    kill = "kill --rank 1 --at-step 5 --mode kill --recover --checkpoint-every 2 --nodes 2"
    assert main([*kill.split(), "--hosts", f"{H0},{H1}"]) == 2
    err = capsys.readouterr().err
    assert "share no volume" not in err and "docker-host0.sock" in err, err
