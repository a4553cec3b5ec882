# SPDX-License-Identifier: MIT
"""The deploy files checked against each other, against the code, and against
a running dormantd: Kubernetes manifests (ports, probes, token, labels
consistent across StatefulSet, Service, NetworkPolicy, PodMonitor), the
Dockerfile, the alerting rules and the Grafana dashboard (every metric they
use exists in the contract and in a live /metrics), and the rank launcher."""
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml

from conftest import DEPLOY, KUBE, SOURCE_ROOT, load_kube, one, tool

sys.path.insert(0, str(SOURCE_ROOT / "python"))
from dormant.client import Client, RankError  # noqa: E402

# dormantctl's commands and the route each asks (ctl/outcome.c).
CTL_PATHS = {"health": "/healthz", "ready": "/readyz", "stats": "/stats",
             "sleep": "/sleep", "wake": "/wake"}


@pytest.fixture(scope="module")
def kube():
    return load_kube()


@pytest.fixture(scope="module")
def trainer(kube):
    sts = one(kube, "StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return sts, container


def option(args, name):
    """The value after `name` in an argument list."""
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


def trainer_policy(kube):
    """The NetworkPolicy of the ranks' ingress."""
    (np,) = [p for p in kube["NetworkPolicy"] if "Ingress" in p["spec"]["policyTypes"]]
    return np


def port_range(spec):
    first, _, last = spec.partition("-")
    return list(range(int(first), int(last or first) + 1))


# ---- Kubernetes --------------------------------------------------------------

def test_every_manifest_is_listed_in_kustomization(kube):
    kust = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    listed = set(kust["resources"])
    for path in listed:
        assert (KUBE / path).exists(), path
    on_disk = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    # the orchestrator Job is an example run by hand (generateName); the
    # Secret is created by hand so that re-applying never resets the token
    assert on_disk - listed == {"orchestrator-job.yaml", "secret.yaml"}
    assert {d["kind"] for ds in kube.values() for d in ds} >= {
        "StatefulSet", "Service", "NetworkPolicy", "PodMonitor", "Secret", "Job"}


def test_statefulset_shape(kube, trainer):
    sts, c = trainer
    spec = sts["spec"]
    pod = spec["template"]
    labels = pod["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    assert spec["podManagementPolicy"] == "Parallel"
    # one pod per node
    anti = pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert anti[0]["labelSelector"]["matchLabels"].items() <= labels.items()
    # non-root, as the image
    sc = pod["spec"]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] >= 1000
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    # a graceful stop lets a transition finish
    assert pod["spec"]["terminationGracePeriodSeconds"] >= 60


def test_one_process_and_port_per_gpu(trainer):
    sts, c = trainer
    ports = [p["containerPort"] for p in c["ports"]]
    names = [p["name"] for p in c["ports"]]
    ranks = int(option(c["command"], "--ranks"))
    base = int(option(c["command"], "--base-port"))
    assert c["command"][0] == "dormant-ranks" and c["command"][-1] == "--"
    assert ports == list(range(base, base + ranks))
    assert names == [f"rank-{r}" for r in range(ranks)]
    for name in names:  # IANA service names: at most 15 characters
        assert re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?", name)
    assert int(c["resources"]["limits"]["nvidia.com/gpu"]) == ranks
    assert "0.0.0.0:{port}" in c["args"]


def test_probes_ask_every_rank(trainer):
    sts, c = trainer
    ports = [p["containerPort"] for p in c["ports"]]
    expected = {"startupProbe": "/healthz", "livenessProbe": "/healthz",
                "readinessProbe": "/readyz"}
    for probe, path in expected.items():
        cmd = c[probe]["exec"]["command"]
        assert cmd[0] == "dormantctl"
        assert CTL_PATHS[cmd[1]] == path, f"{probe} asks {CTL_PATHS[cmd[1]]}"
        assert port_range(option(cmd, "--port")) == ports
        assert cmd[-1] == "127.0.0.1"
        assert "--no-progress" in cmd
        # dormantctl must finish before the kubelet gives up on the probe
        assert float(option(cmd, "--timeout")) * (1 + int(option(cmd, "--retries"))) \
            < c[probe]["timeoutSeconds"]


def test_headless_service(kube, trainer):
    sts, c = trainer
    svc = one(kube, "Service")
    assert sts["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    container = {(p["name"], p["containerPort"]) for p in c["ports"]}
    service = {(p["name"], p["port"]) for p in svc["spec"]["ports"]}
    assert service == container
    for p in svc["spec"]["ports"]:
        assert p["targetPort"] == p["name"]


def test_network_policy_admits_only_orchestrator_and_prometheus(kube, trainer):
    sts, c = trainer
    pod_labels = sts["spec"]["template"]["metadata"]["labels"]
    ports = sorted(p["containerPort"] for p in c["ports"])
    np = trainer_policy(kube)
    assert np["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert np["spec"]["policyTypes"] == ["Ingress"]

    def covers(rule, port):
        return any(r.get("protocol", "TCP") == "TCP" and r["port"] <= port <= r.get("endPort", r["port"])
                   for r in rule.get("ports", []))

    dormant_rules = [r for r in np["spec"]["ingress"] if any(covers(r, p) for p in ports)]
    assert len(dormant_rules) == 1, "one rule, and only one, opens the dormant ports"
    (rule,) = dormant_rules
    assert all(covers(rule, p) for p in ports)
    assert not covers(rule, ports[0] - 1) and not covers(rule, ports[-1] + 1)
    sources = rule["from"]
    orchestrator = [s for s in sources if "namespaceSelector" not in s]
    prometheus = [s for s in sources if "namespaceSelector" in s]
    assert len(orchestrator) == 1 and len(prometheus) == 1
    assert orchestrator[0]["podSelector"]["matchLabels"] == {"dormant.io/orchestrator": "true"}
    assert prometheus[0]["podSelector"]["matchLabels"]

    # the trainers reach each other everywhere else (NCCL), not on the dormant ports
    peers = [r for r in np["spec"]["ingress"] if r is not rule]
    assert peers, "without a peer rule the ranks could not talk to each other"
    for r in peers:
        assert not any(covers(r, p) for p in ports)
    assert any(covers(r, ports[0] - 1) and covers(r, ports[-1] + 1) for r in peers)


def test_podmonitor_scrapes_every_rank(kube, trainer):
    sts, c = trainer
    pm = one(kube, "PodMonitor")
    assert pm["spec"]["selector"]["matchLabels"].items() <= \
        sts["spec"]["template"]["metadata"]["labels"].items()
    endpoints = pm["spec"]["podMetricsEndpoints"]
    assert [e["port"] for e in endpoints] == [p["name"] for p in c["ports"]]
    for e in endpoints:
        assert e["path"] == "/metrics"
        relabel = {r["targetLabel"]: r for r in e["relabelings"]}
        assert relabel["job"]["replacement"] == "dormant"
        assert relabel["local_rank"]["sourceLabels"] == ["__meta_kubernetes_pod_container_port_name"]
        m = re.fullmatch(relabel["local_rank"]["regex"], e["port"])
        assert m and m.expand(relabel["local_rank"]["replacement"].replace("$", "\\")) == \
            e["port"].split("-")[1]


def test_prometheus_annotations(trainer):
    sts, c = trainer
    ann = sts["spec"]["template"]["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert ann["prometheus.io/path"] == "/metrics"
    # one port annotation would collapse the eight ranks into one target
    assert "prometheus.io/port" not in ann


def test_plain_prometheus_scrape_config(trainer):
    sts, c = trainer
    conf = yaml.safe_load((DEPLOY / "prometheus" / "scrape-config.yml").read_text())
    (job,) = conf["scrape_configs"]
    assert job["job_name"] == "dormant" and job["metrics_path"] == "/metrics"
    relabel = job["relabel_configs"]
    keep_app = next(r for r in relabel if r["source_labels"] ==
                    ["__meta_kubernetes_pod_label_app_kubernetes_io_name"])
    assert keep_app["regex"] == sts["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"]
    keep_port = next(r for r in relabel if r.get("action") == "keep" and r["source_labels"] ==
                     ["__meta_kubernetes_pod_container_port_name"])
    assert all(re.fullmatch(keep_port["regex"], p["name"]) for p in c["ports"])
    targets = {r.get("target_label") for r in relabel}
    assert {"local_rank", "namespace", "pod"} <= targets


def test_token_secret_is_wired(kube, trainer):
    sts, c = trainer
    secret = one(kube, "Secret")
    name = secret["metadata"]["name"]
    assert set(secret["stringData"]) == {"token"}
    assert "REPLACE" in secret["stringData"]["token"], "never commit a real token"
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in c["volumeMounts"] if volumes[m["name"]].get("secret")]
    assert volumes[mount["name"]]["secret"]["secretName"] == name
    assert mount["readOnly"] is True
    token_path = f"{mount['mountPath']}/token"
    assert option(c["args"], "--token-file") == token_path
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["DORMANT_TOKEN_FILE"] == token_path
    assert "--open-probes" in c["args"], "probes and Prometheus carry no token"


def test_orchestrator_job_reaches_every_rank(kube, trainer):
    sts, c = trainer
    job = one(kube, "Job")
    pod = job["spec"]["template"]
    np = trainer_policy(kube)
    admitted = np["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert admitted.items() <= pod["metadata"]["labels"].items()
    (jc,) = pod["spec"]["containers"]
    cmd = jc["command"]
    assert cmd[0] == "dormantctl" and cmd[1] in ("sleep", "wake")
    assert option(cmd, "--dns") == one(kube, "Service")["metadata"]["name"]
    assert port_range(option(cmd, "--port")) == [p["containerPort"] for p in c["ports"]]
    secret_volume = next(v for v in pod["spec"]["volumes"] if "secret" in v)
    assert secret_volume["secret"]["secretName"] == one(kube, "Secret")["metadata"]["name"]
    mount = next(m for m in jc["volumeMounts"] if m["name"] == secret_volume["name"])
    assert option(cmd, "--token-file") == f"{mount['mountPath']}/token"
    assert jc["image"] == c["image"]


def test_pods_are_hardened(kube, trainer):
    """issue 25: a seccomp profile on every pod, no service account token."""
    sts, c = trainer
    job = one(kube, "Job")
    for pod in (sts["spec"]["template"]["spec"], job["spec"]["template"]["spec"]):
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["securityContext"]["runAsNonRoot"] is True
        for container in pod["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]


def test_orchestrator_egress_reaches_the_ranks_and_dns_only(kube, trainer):
    sts, c = trainer
    job = one(kube, "Job")
    (egress,) = [p for p in kube["NetworkPolicy"] if p["spec"]["policyTypes"] == ["Egress"]]
    assert egress["__file__"] in yaml.safe_load(
        (KUBE / "kustomization.yaml").read_text())["resources"]
    selector = egress["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()
    ports = [p["containerPort"] for p in c["ports"]]
    rules = egress["spec"]["egress"]
    assert all(r.get("to") and r.get("ports") for r in rules), "no rule opens everything"
    trainer_labels = sts["spec"]["template"]["metadata"]["labels"]
    (ranks,) = [r for r in rules if any("namespaceSelector" not in t for t in r["to"])]
    assert ranks["to"][0]["podSelector"]["matchLabels"].items() <= trainer_labels.items()
    (opened,) = ranks["ports"]
    assert (opened["protocol"], opened["port"], opened["endPort"]) == ("TCP", ports[0], ports[-1])
    (dns,) = [r for r in rules if r is not ranks]
    assert {(p["protocol"], p["port"]) for p in dns["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert dns["to"][0]["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}


def test_the_placeholder_token_is_refused_by_the_server(kube, tmp_path):
    placeholder = one(kube, "Secret")["stringData"]["token"]
    token = tmp_path / "token"
    token.write_text(placeholder + "\n")
    p = subprocess.run([tool("dormantd"), "--backend", "host", "--keep", "1MiB", "--discard",
                        "1MiB", "--listen", "127.0.0.1:0", "--token-file", str(token)],
                       capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert "placeholder" in p.stderr, p.stderr


def test_dockerfile_starts_with_the_token_of_the_secret(kube, trainer, tmp_path):
    sts, c = trainer
    text = dockerfile()
    cmd = json.loads(re.search(r"^CMD (\[.*\])$", text, re.M).group(1))
    token_path = option(c["args"], "--token-file")
    assert cmd[0] == "dormantd" and option(cmd, "--token-file") == token_path
    assert option(cmd, "--listen").startswith("0.0.0.0:")
    health = json.loads(re.search(r"^    CMD (\[.*\])$", text, re.M).group(1))
    assert health[:2] == ["dormantctl", "health"] and option(health, "--token-file") == token_path
    # the image's command, run here: refused without its token, served with one
    local = [tool("dormantd"), "--backend", "host", "--keep", "1MiB", "--discard", "1MiB",
             *cmd[1:]]
    local[local.index("--listen") + 1] = "0.0.0.0:0"
    missing = tmp_path / "none" / "token"
    local[local.index("--token-file") + 1] = str(missing)
    p = subprocess.run(local, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2 and str(missing) in p.stderr, p.stderr
    without = [a for i, a in enumerate(local) if a != "--token-file" and
               local[i - 1] != "--token-file"]
    p = subprocess.run(without, capture_output=True, text=True, timeout=60, check=False)
    assert p.returncode == 2 and "without a token" in p.stderr, p.stderr


def test_probe_commands_run(trainer, daemon):
    """The probes' dormantctl invocations, pointed at two real ranks."""
    sts, c = trainer
    ranks = [daemon("--open-probes", "--token", "t0k"), daemon("--open-probes", "--token", "t0k")]
    ports = ",".join(str(d.port) for d in ranks)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        cmd = list(c[probe]["exec"]["command"])
        cmd[0] = tool("dormantctl")
        cmd[cmd.index("--port") + 1] = ports
        env = {k: v for k, v in os.environ.items() if not k.startswith("DORMANT_TOKEN")}
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 0, f"{probe}: {p.stdout}{p.stderr}"
        assert "2 endpoints: 2 ok, 0 failed" in p.stdout
    # and a probe fails, naming the rank, when one rank is gone
    ranks[1].stop()
    cmd = list(c["livenessProbe"]["exec"]["command"])
    cmd[0] = tool("dormantctl")
    cmd[cmd.index("--port") + 1] = ports
    cmd[cmd.index("--retries") + 1] = "0"
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and f"127.0.0.1:{ranks[1].port}" in p.stderr


def test_statefulset_dormantd_flags_are_real(trainer, tmp_path):
    """dormantd accepts the manifest's arguments (with the host backend, small
    sizes, a free port and a local token file)."""
    sts, c = trainer
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    args = [tool("dormantd") if a == "dormantd" else a for a in c["args"]]
    args = [a.replace("{port}", "0") for a in args]
    args[args.index("--backend") + 1] = "host"
    args[args.index("--keep") + 1] = "4MiB"
    args[args.index("--discard") + 1] = "4MiB"
    args[args.index("--token-file") + 1] = str(token)
    args[args.index("--listen") + 1] = "127.0.0.1:0"
    port_file = tmp_path / "port"
    proc = subprocess.Popen(args + ["--port-file", str(port_file)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text().strip()):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.02)
        url = f"http://127.0.0.1:{int(port_file.read_text())}"
        # probes open, transitions behind the token from the file
        anonymous = Client([url], token=False, retries=0, timeout=10)
        assert anonymous.ready()[0].ok
        with pytest.raises(RankError) as e:
            anonymous.stats()
        assert e.value.failed[0].status == 401
        stats, = Client([url], token_file=str(token), retries=0, timeout=10).stats()
        assert stats.body["host_mode"] == option(c["args"], "--host-mode")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)
        proc.stderr.close()


# ---- Dockerfile ------------------------------------------------------------------

def dockerfile():
    return (DEPLOY / "Dockerfile").read_text()


def test_dockerfile_stages_and_user(trainer):
    sts, c = trainer
    text = dockerfile()
    version = re.search(r"^ARG CUDA_VERSION=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"13\.0\.\d+", version)
    froms = re.findall(r"^FROM (\S+)(?: AS (\S+))?$", text, re.M)
    assert froms == [("nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04", "build"),
                     ("nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04", "")]
    user = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert user and int(user[-1][0]) != 0
    assert int(user[-1][0]) == sts["spec"]["template"]["spec"]["securityContext"]["runAsUser"]
    exposed = re.search(r"^EXPOSE (\d+)-(\d+)$", text, re.M)
    ports = [p["containerPort"] for p in c["ports"]]
    assert [int(exposed.group(1)), int(exposed.group(2))] == [ports[0], ports[-1]]
    # what the manifests run is in the image
    for needed in ("dormant-ranks", "dormantctl", "dormantd", "import dormant"):
        assert needed in text
    assert (SOURCE_ROOT / "deploy" / "dormant-ranks").exists()
    assert "COPY --from=build" in text
    # build dependencies cover the meson dependencies of the tree
    for pkg in ("libmicrohttpd-dev", "libjansson-dev", "libcurl4-openssl-dev", "meson"):
        assert pkg in text
    for pkg in ("libmicrohttpd12t64", "libjansson4", "libcurl4t64"):
        assert pkg in text
    assert (DEPLOY / "Dockerfile.dockerignore").read_text().count(".git") >= 1


# ---- Prometheus and Grafana ---------------------------------------------------------

def contract_metrics():
    """{name: type} from the metrics table of docs/contract.md."""
    text = (SOURCE_ROOT / "docs" / "contract.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n## ", 1)[0]
    found = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("dormant_"):
            for name in cells[0].split(","):
                found[name.strip()] = cells[1].split()[0]
    assert len(found) > 15, found
    return found


METRIC_RE = re.compile(r"\b(dormant_[a-z_]+|up)\b(?!\s*\()")


def base_metric(name, histograms):
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name[: -len(suffix)] in histograms:
            return name[: -len(suffix)]
    return name


def used_metrics(exprs):
    contract = contract_metrics()
    histograms = {n for n, t in contract.items() if t == "histogram"}
    return {base_metric(m, histograms) for e in exprs for m in METRIC_RE.findall(e)}


def rule_exprs():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "dormant-rules.yml").read_text())
    return [r["expr"] for g in rules["groups"] for r in g["rules"]]


def dashboard():
    return json.loads((DEPLOY / "grafana" / "dormant.json").read_text())


def dashboard_exprs(d):
    return [t["expr"] for p in d["panels"] for t in p.get("targets", [])]


def test_rules_use_contract_metrics():
    contract = contract_metrics()
    used = used_metrics(rule_exprs())
    assert used - set(contract) - {"up"} == set()
    for expr in rule_exprs():
        for selector in re.findall(r"\b(?:dormant_[a-z_]+|up)\{([^}]*)\}", expr):
            assert 'job="dormant"' in selector, expr


def test_rule_alerts_cover_the_issue():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "dormant-rules.yml").read_text())
    alerts = {r["alert"] for g in rules["groups"] for r in g["rules"]}
    assert {"DormantWakeFailed", "DormantTransitionStuck", "DormantRankDown",
            "DormantRanksMissing", "DormantUnhealthy"} <= alerts
    tests = yaml.safe_load((DEPLOY / "prometheus" / "dormant-rules.test.yml").read_text())
    tested = {a["alertname"] for t in tests["tests"] for a in t["alert_rule_test"]
              if a["exp_alerts"]}
    assert tested == alerts, f"alerts never seen firing in a test: {alerts - tested}"


def test_dashboard_structure():
    d = dashboard()
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    names = {v["name"] for v in d["templating"]["list"]}
    assert {"datasource", "namespace", "window"} <= names
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for topic in ("state per rank", "device bytes", "host bytes", "duration", "time goes",
                  "failed"):
        assert topic in titles
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["datasource"]["uid"] == "${datasource}"
        assert p["targets"], p["title"]
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        for t in p["targets"]:
            assert 'job="dormant"' in t["expr"] and 'namespace=~"$namespace"' in t["expr"]
    exprs = dashboard_exprs(d)
    assert any("dormant_transition_duration_seconds_bucket" in e and "histogram_quantile" in e
               for e in exprs)
    contract = contract_metrics()
    assert used_metrics(exprs) - set(contract) - {"up"} == set()


def test_dashboard_queries_parse(tmp_path):
    """Every panel query, its variables filled in, is valid PromQL to promtool."""
    d = dashboard()
    rules = []
    for i, expr in enumerate(dashboard_exprs(d)):
        filled = (expr.replace("$namespace", ".*").replace("$__rate_interval", "1m")
                  .replace("$window", "1h"))
        assert "$" not in filled, filled
        rules.append({"record": f"dashboard:query_{i}", "expr": filled})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    p = subprocess.run([tool("promtool"), "check", "rules", str(path)], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"SUCCESS: {len(rules)} rules found" in p.stdout


def live_metrics(d):
    with urllib.request.urlopen(d.url + "/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return r.read().decode()


def test_live_metrics_pass_promtool_and_hold_what_we_use(daemon):
    d = daemon("--fail-wakes", "1")
    # a sleep, a failed wake and a good one: every series has appeared
    rank = Client([d.url], token=False, retries=0, timeout=10, raise_on_error=False)
    for action, status in (("sleep", 200), ("wake", 503), ("wake", 200)):
        assert getattr(rank, action)()[0].status == status, action
    text = live_metrics(d)
    p = subprocess.run([tool("promtool"), "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr

    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    contract = contract_metrics()
    for name, kind in contract.items():
        assert types.get(name) == kind, f"{name}: contract says {kind}, /metrics {types.get(name)}"
    used = used_metrics(rule_exprs() + dashboard_exprs(dashboard())) - {"up"}
    assert used <= set(types), used - set(types)
    # the labels the rules and the dashboard group by come from the target, not the rank
    for label in ("namespace", "pod", "local_rank", "job"):
        assert f'{label}="' not in text
    assert re.search(r'^dormant_last_transition_success\{kind="wake"\} 1$', text, re.M)
    assert re.search(r'^dormant_transitions_total\{kind="wake",result="failed"\} 1$', text, re.M)


PHASES = ("sync", "host_prep", "host_pin", "host_wait", "copy", "release", "map", "map_wait",
          "zero_wait", "comms", "setup", "checksum", "rebuild", "warmup_wait")


def test_live_phase_seconds_sum_every_transition(daemon):
    """dormant_transition_phase_seconds_total{kind,phase}: every part of the
    times /stats reports for each sleep and wake that ran, summed, a failed
    wake's too; no-ops add nothing."""
    d = daemon("--fail-wakes", "1")
    rank = Client([d.url], token=False, retries=0, timeout=10, raise_on_error=False)
    want = {(k, p): 0.0 for k in ("sleep", "wake") for p in PHASES}
    runs = 0
    for action, status, ran in (("sleep", 200, True), ("sleep", 200, False), ("wake", 503, True),
                                ("wake", 200, True), ("wake", 200, False), ("sleep", 200, True),
                                ("wake", 200, True)):
        assert getattr(rank, action)()[0].status == status, action
        if ran:
            runs += 1
            last = rank.stats()[0].body[f"last_{action}"]
            for p in PHASES:
                want[action, p] += last["times"][f"{p}_s"]
    text = live_metrics(d)
    assert re.search(r"^# TYPE dormant_transition_phase_seconds_total counter$", text, re.M)
    got = {(k, p): float(v) for k, p, v in re.findall(
        r'^dormant_transition_phase_seconds_total\{kind="(\w+)",phase="(\w+)"\} (\S+)$',
        text, re.M)}
    assert set(got) == set(want), set(got) ^ set(want)
    for key, value in want.items():
        # /stats rounds each part to the nanosecond
        assert abs(got[key] - value) <= runs * 1e-9, f"{key}: /metrics {got[key]}, /stats {value}"
    for key in (("sleep", "copy"), ("sleep", "release"), ("wake", "map"), ("wake", "copy")):
        assert got[key] > 0, key


# ---- the rank launcher ---------------------------------------------------------------

LAUNCHER = str(DEPLOY / "dormant-ranks")


def test_launcher_fills_in_ranks_and_stops_all_when_one_ends(tmp_path):
    out = tmp_path
    # Each rank writes its file under another name and renames it, so that
    # rank 1 (which waits for the others' files) never sees one half written.
    script = (f'echo "{{rank}} {{port}} $LOCAL_RANK $DORMANT_PORT $CUDA_VISIBLE_DEVICES" '
              f'> {out}/{{rank}}.tmp && mv {out}/{{rank}}.tmp {out}/{{rank}}; '
              f'if [ {{rank}} = 1 ]; then '
              f'  while [ ! -e {out}/0 ] || [ ! -e {out}/2 ]; do sleep 0.02; done; exit 3; '
              f'fi; exec sleep 120')
    p = subprocess.run([LAUNCHER, "--ranks", "3", "--base-port", "9000", "--", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stderr
    for r in range(3):
        assert (out / str(r)).read_text().split() == [str(r), str(9000 + r), str(r),
                                                      str(9000 + r), str(r)]


def test_launcher_no_visible_devices(tmp_path):
    p = subprocess.run([LAUNCHER, "--ranks", "1", "--no-visible-devices", "--", "sh", "-c",
                        'echo "[${CUDA_VISIBLE_DEVICES-unset}]"'],
                       capture_output=True, text=True, timeout=30,
                       env={k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"})
    assert p.returncode == 0 and p.stdout.strip() == "[unset]"


@pytest.mark.parametrize("args, message", [
    (["--ranks", "0", "--", "true"], "--ranks must be 1 to 64"),
    (["--ranks", "x", "--", "true"], "--ranks must be 1 to 64"),
    (["--base-port", "65535", "--ranks", "2", "--", "true"], "--base-port"),
    (["--bogus", "--", "true"], "unknown option"),
    (["--ranks", "2"], "no command given"),
])
def test_launcher_usage_errors(args, message):
    p = subprocess.run([LAUNCHER, *args], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and message in p.stderr


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_launcher_help_is_its_header(flag):
    p = subprocess.run([LAUNCHER, flag], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("dormant-ranks: run one process per local rank"), lines[0]
    assert "  dormant-ranks [--ranks N] [--base-port P] [--no-visible-devices] -- COMMAND [ARG...]" \
        in lines
    assert any("N is 8" in line for line in lines) and "set -u" not in p.stdout
    assert not any(line.startswith("#") for line in lines), p.stdout


def test_launcher_usage_error_names_the_usage():
    p = subprocess.run([LAUNCHER, "--bogus"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.splitlines()[-1] == (
        "usage: dormant-ranks [--ranks N] [--base-port P] [--no-visible-devices] -- COMMAND [ARG...]")


def test_launcher_runs_ranks_of_dormantd_and_stops_them_on_sigterm(tmp_path):
    """The container's entry point with real ranks: two dormantd, each on a
    free port written to its own file, all healthy through dormantctl; SIGTERM
    stops every one."""
    proc = subprocess.Popen(
        [LAUNCHER, "--ranks", "2", "--base-port", "0", "--no-visible-devices", "--",
         tool("dormantd"), "--backend", "host", "--listen", "127.0.0.1:{port}",
         "--port-file", f"{tmp_path}/rank-{{rank}}.port", "--keep", "4MiB", "--discard", "4MiB",
         "--quiet"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        files = [tmp_path / f"rank-{r}.port" for r in range(2)]
        deadline = time.monotonic() + 20
        while not all(f.exists() and f.read_text().strip() for f in files):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "ranks did not start"
            time.sleep(0.02)
        ports = ",".join(f.read_text().strip() for f in files)
        p = subprocess.run([tool("dormantctl"), "health", "--port", ports, "--no-progress",
                            "127.0.0.1"], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stdout + p.stderr
        assert "2 endpoints: 2 ok, 0 failed" in p.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        status = proc.wait(timeout=30)
        proc.stderr.close()
    assert status == 143
    p = subprocess.run([tool("dormantctl"), "health", "--port", ports, "--retries", "0",
                        "--no-progress", "127.0.0.1"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "2 endpoints: 0 ok, 2 failed" in p.stdout
