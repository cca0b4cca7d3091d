"""//deploy:manifests_test: the Kubernetes manifests and the Helm chart.

Renders the chart (deploy/helm/render.py: the subset of Go templates the
chart uses, as Helm evaluates it) with its default values, with TLS off and
with other names and ports, and checks in each rendering that:
- every PSERVER_<FLAG> a server gets is a flag of the real pserver binary
  (its --help), every psctl flag the probe script passes is one of the real
  psctl's (`psctl health -help`), and the trainer's arguments parse;
- ports agree: the servers' PSERVER_PORT / PSERVER_METRICS_PORT, their
  container ports, the headless Service, the Prometheus annotations; etcd's
  ports in its environment, containers, Services, probe and PSERVER_ETCD;
- names agree: the headless Services the StatefulSets name, the stable DNS
  name each server advertises, the checkpoint claim, the TLS secret mounts
  under the PSERVER_TLS_* paths, one image everywhere, the same etcd and
  cluster for servers and trainers;
- the plain manifests (deploy/kubernetes) are the chart rendered with its
  defaults, and kustomization.yaml lists them all (and, where a kubectl is
  on PATH, `kubectl kustomize` builds the same objects);
- the image's scripts the manifests run (pserver-health, etcd-member) are
  staged into the image and build the commands they should.
"""
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

import yaml

ROOT = os.getcwd()
sys.path.insert(0, os.path.join(ROOT, "deploy", "helm"))
sys.path.insert(0, os.path.join(ROOT, "deploy", "trainer"))
import render  # noqa: E402
import train  # noqa: E402

PSERVER = os.path.join(ROOT, "cc", "server", "pserver")
PSCTL = os.path.join(ROOT, "go", "cmd", "psctl", "psctl")
TMP = os.environ.get("TEST_TMPDIR", tempfile.gettempdir())

VARIANTS = {
    "defaults": [],
    "tls off": ["tls.enabled=false"],
    "other names and ports": [
        "pserver.name=ps", "pserver.port=7100", "pserver.metricsPort=9500",
        "pserver.replicas=5", "etcd.name=coord", "etcd.clientPort=2479",
        "etcd.peerPort=2480", "etcd.replicas=5", "cluster=exp-1",
        "image=registry.example.com/pserver:1", "pserver.checkpointStorageClass=nfs",
    ],
}


def run(args, **kwargs):
    return subprocess.run(args, check=True, capture_output=True, text=True, timeout=600,
                          **kwargs).stdout


def pserver_flags():
    help_text = run([PSERVER, "--help"])
    return set(re.findall(r"^\s+--([a-z0-9_]+) \(", help_text, re.M))


def psctl_health_flags():
    env = dict(os.environ, XDG_CACHE_HOME=os.path.join(TMP, "cache"), HOME=TMP)
    out = subprocess.run([PSCTL, "health", "-help"], capture_output=True, text=True,
                         timeout=900, env=env)
    return set(re.findall(r"^\s+-([a-z0-9_]+)", out.stdout + out.stderr, re.M))


def objects(text):
    return [d for d in yaml.safe_load_all(text) if d]


def find(objs, kind, name=None):
    found = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    if name is not None and len(found) != 1:
        raise AssertionError(f"want one {kind} {name!r}, found {len(found)}")
    return found


def env_of(container):
    return {e["name"]: e for e in container.get("env", [])}


def value(env, name):
    if name not in env:
        raise AssertionError(f"no {name} in the container's environment")
    return env[name]["value"]


def port(container, name):
    for p in container.get("ports", []):
        if p["name"] == name:
            return p["containerPort"]
    raise AssertionError(f"container {container['name']} has no port named {name}")


def service_port(service, name):
    for p in service["spec"]["ports"]:
        if p["name"] == name:
            return p["port"]
    raise AssertionError(f"Service {service['metadata']['name']} has no port named {name}")


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def selects(service, workload):
    labels = workload["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in service["spec"]["selector"].items())


def mount_of(container, spec, path):
    """The volume (and its sub path) the container's path lies in."""
    best = None
    for m in container.get("volumeMounts", []):
        if path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"):
            if best is None or len(m["mountPath"]) > len(best["mountPath"]):
                best = m
    if best is None:
        raise AssertionError(f"{path} is on no volume of container {container['name']}")
    for v in spec.get("volumes", []):
        if v["name"] == best["name"]:
            return v
    raise AssertionError(f"volume mount {best['name']} names no volume")


class ChartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.flags = pserver_flags()
        assert {"port", "etcd", "advertise_host"} <= cls.flags, cls.flags
        cls.psctl_flags = psctl_health_flags()
        assert {"servers", "tls_cert"} <= cls.psctl_flags, cls.psctl_flags

    def render(self, sets):
        values = render.load_values(sets)
        return values, objects("\n---\n".join(render.render_chart(values).values()))

    def test_every_variant_is_consistent(self):
        for variant, sets in VARIANTS.items():
            with self.subTest(variant=variant):
                values, objs = self.render(sets)
                self.check_servers(values, objs)
                self.check_etcd(values, objs)
                self.check_trainer(values, objs)
                for o in objs:
                    if o["kind"] in ("StatefulSet", "Job"):
                        for c in pod_spec(o)["containers"]:
                            self.assertEqual(c["image"], values["image"], o["metadata"]["name"])

    def check_servers(self, values, objs):
        name = values["pserver"]["name"]
        sts = find(objs, "StatefulSet", name)[0]
        service = find(objs, "Service", sts["spec"]["serviceName"])[0]
        self.assertEqual(service["spec"]["clusterIP"], "None")
        self.assertTrue(selects(service, sts))
        spec = pod_spec(sts)
        (c,) = spec["containers"]
        env = env_of(c)
        for var in env:
            if var.startswith("PSERVER_"):
                self.assertTrue(var[len("PSERVER_"):].lower() in self.flags,
                                f"{var}: pserver has no flag --{var[8:].lower()}")
        for arg in c.get("command", []) + c.get("args", []):
            m = re.match(r"--([a-z0-9_]+)", arg)
            if m:
                self.assertTrue(m.group(1) in self.flags, f"{arg}: pserver has no such flag")
        # Stable names: <pod>.<headless service>.<namespace>.svc, from the downward API.
        self.assertEqual(value(env, "PSERVER_ADVERTISE_HOST"),
                         f"$(POD_NAME).{service['metadata']['name']}.$(POD_NAMESPACE).svc")
        names = list(env)
        for var, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
            self.assertEqual(env[var]["valueFrom"]["fieldRef"]["fieldPath"], field)
            self.assertLess(names.index(var), names.index("PSERVER_ADVERTISE_HOST"))
        self.assertEqual(value(env, "PSERVER_HOST"), "0.0.0.0")
        self.assertEqual(value(env, "PSERVER_NUM_SERVERS"), str(sts["spec"]["replicas"]))
        # Ports.
        grpc = int(value(env, "PSERVER_PORT"))
        metrics = int(value(env, "PSERVER_METRICS_PORT"))
        self.assertEqual(port(c, "grpc"), grpc)
        self.assertEqual(port(c, "metrics"), metrics)
        self.assertEqual(service_port(service, "grpc"), grpc)
        self.assertEqual(service_port(service, "metrics"), metrics)
        annotations = sts["spec"]["template"]["metadata"]["annotations"]
        self.assertEqual(annotations["prometheus.io/port"], str(metrics))
        self.assertEqual(annotations["prometheus.io/scrape"], "true")
        self.assertEqual(value(env, "PSERVER_METRICS_HOST"), "0.0.0.0")
        # Probes: the image's health script, which reads PSERVER_PORT and PSERVER_TLS_*.
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertEqual(c[probe]["exec"]["command"][0], "/opt/pserver/bin/pserver-health")
        # Checkpoints: on the shared claim.
        volume = mount_of(c, spec, value(env, "PSERVER_CHECKPOINT_DIR"))
        claim = find(objs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])[0]
        self.assertEqual(claim["spec"]["accessModes"], ["ReadWriteMany"])
        storage_class = values["pserver"]["checkpointStorageClass"]
        self.assertEqual(claim["spec"].get("storageClassName", ""), storage_class)
        self.check_tls(values, c, spec, env, values["tls"]["serverSecret"])

    def check_tls(self, values, container, spec, env, secret):
        tls_vars = ["PSERVER_TLS_CERT", "PSERVER_TLS_KEY", "PSERVER_TLS_CA"]
        if not values["tls"]["enabled"]:
            for var in tls_vars:
                self.assertNotIn(var, env)
            return
        for var, key in zip(tls_vars, ["tls.crt", "tls.key", "ca.crt"]):
            path = value(env, var)
            volume = mount_of(container, spec, path)
            self.assertEqual(volume["secret"]["secretName"], secret, var)
            self.assertEqual(os.path.basename(path), key, var)

    def check_etcd(self, values, objs):
        name = values["etcd"]["name"]
        sts = find(objs, "StatefulSet", name)[0]
        headless = find(objs, "Service", sts["spec"]["serviceName"])[0]
        self.assertEqual(headless["spec"]["clusterIP"], "None")
        self.assertTrue(headless["spec"]["publishNotReadyAddresses"])
        self.assertTrue(selects(headless, sts))
        (c,) = pod_spec(sts)["containers"]
        env = env_of(c)
        self.assertEqual(c["command"], ["/opt/pserver/bin/etcd-member"])
        self.assertEqual(value(env, "ETCD_SERVICE"), headless["metadata"]["name"])
        self.assertEqual(value(env, "ETCD_REPLICAS"), str(sts["spec"]["replicas"]))
        client = int(value(env, "ETCD_CLIENT_PORT"))
        peer = int(value(env, "ETCD_PEER_PORT"))
        self.assertEqual(port(c, "client"), client)
        self.assertEqual(port(c, "peer"), peer)
        self.assertEqual(service_port(headless, "client"), client)
        self.assertEqual(service_port(headless, "peer"), peer)
        self.assertIn(f"--endpoints=127.0.0.1:{client}", c["readinessProbe"]["exec"]["command"])
        # Servers reach etcd through the client Service.
        server_env = env_of(pod_spec(find(objs, "StatefulSet", values["pserver"]["name"])[0])["containers"][0])
        host, etcd_port = value(server_env, "PSERVER_ETCD").rsplit(":", 1)
        client_service = find(objs, "Service", host)[0]
        self.assertTrue(selects(client_service, sts))
        self.assertEqual(service_port(client_service, "client"), int(etcd_port))
        self.assertEqual(int(etcd_port), client)

    def check_trainer(self, values, objs):
        job = find(objs, "Job", values["trainer"]["name"])[0]
        spec = pod_spec(job)
        (c,) = spec["containers"]
        env = env_of(c)
        server_env = env_of(pod_spec(find(objs, "StatefulSet", values["pserver"]["name"])[0])["containers"][0])
        for var in ("PSERVER_ETCD", "PSERVER_CLUSTER"):
            self.assertEqual(value(env, var), value(server_env, var))
        self.assertEqual(c["command"][:2], ["python3", "/opt/pserver/trainer/train.py"])
        args = train.parse_args(c["command"][2:] + ["--etcd", value(env, "PSERVER_ETCD")])
        self.assertEqual(args.steps, values["trainer"]["steps"])
        self.assertEqual(job["spec"]["completionMode"], "Indexed")
        self.check_tls(values, c, spec, env, values["tls"]["trainerSecret"])


class PlainManifestsTest(unittest.TestCase):
    def test_plain_manifests_are_the_chart_rendered_with_its_defaults(self):
        for name, text in render.plain_manifests().items():
            with open(os.path.join(ROOT, "deploy", "kubernetes", name)) as f:
                self.assertEqual(f.read(), text,
                                 f"deploy/kubernetes/{name} is stale: deploy/helm/render.py --write")

    def test_kustomization_lists_every_manifest(self):
        folder = os.path.join(ROOT, "deploy", "kubernetes")
        with open(os.path.join(folder, "kustomization.yaml")) as f:
            kustomization = yaml.safe_load(f)
        files = sorted(n for n in os.listdir(folder) if n != "kustomization.yaml")
        self.assertEqual(sorted(kustomization["resources"]), files)
        kubectl = shutil.which("kubectl")
        if kubectl is None:
            self.skipTest("no kubectl on PATH: `kubectl kustomize` not run")
        # A real copy: kustomize refuses files that are links out of its root
        # (as Bazel's runfiles are).
        copy = os.path.join(tempfile.mkdtemp(dir=TMP), "kubernetes")
        shutil.copytree(folder, copy)
        built = objects(run([kubectl, "kustomize", copy]))
        rendered = objects("\n---\n".join(render.render_chart(render.load_values()).values()))
        key = lambda o: (o["kind"], o["metadata"]["name"])  # noqa: E731
        self.assertEqual(sorted(map(key, built)), sorted(map(key, rendered)))
        self.assertEqual(sorted(built, key=key), sorted(rendered, key=key))


class RendererTest(unittest.TestCase):
    def test_values_quotes_conditions_and_trims(self):
        values = {"a": {"b": 7}, "on": True, "off": False, "s": "x"}
        text = "n: {{ .Values.a.b }}\nq: {{ .Values.a.b | quote }}\n{{- if .Values.on }}\nyes: 1\n" \
               "{{- else }}\nno: 1\n{{- end }}\n{{- if .Values.off }}\nhidden: 1\n{{- end }}\ns: {{ .Values.s }}\n"
        self.assertEqual(render.render(text, values), 'n: 7\nq: "7"\nyes: 1\ns: x\n')

    def test_what_the_renderer_does_not_implement_is_refused(self):
        for text in ("{{ .Values.missing }}", "{{ include \"x\" . }}", "{{ .Values.a | upper }}",
                     "{{ if .Values.a }}", "{{ end }}", "{{ .Release.Name }}"):
            with self.subTest(text=text):
                with self.assertRaises(render.TemplateError):
                    render.render(text, {"a": 1})


def write_stub(folder, name, body):
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


class ImageScriptsTest(unittest.TestCase):
    """The scripts the manifests run in the image, with recording stubs."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(dir=TMP)
        self.log = os.path.join(self.dir, "log")
        for tool in ("psctl", "etcd"):
            write_stub(self.dir, tool, f'for a in "$@"; do echo "$a"; done > {self.log}\n')
        write_stub(self.dir, "hostname", "echo etcd-2\n")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def run_script(self, script, args, env):
        subprocess.run([os.path.join(ROOT, "deploy", "image", script)] + args, check=True,
                       timeout=60, env=dict(env, PATH=f"{self.dir}:/usr/bin:/bin"))
        with open(self.log) as f:
            return f.read().split("\n")[:-1]

    def test_the_image_has_the_scripts_where_the_manifests_run_them(self):
        with open(os.path.join(ROOT, "deploy", "image", "stage.sh")) as f:
            stage = f.read()
        for script, installed in (("pserver-health.sh", "pserver-health"),
                                  ("etcd-member.sh", "etcd-member")):
            self.assertIn(f'"$root/deploy/image/{script}" "$prefix/bin/{installed}"', stage)
        self.assertIn('"$root/deploy/trainer/train.py" "$prefix/trainer/train.py"', stage)

    def test_health_probe_asks_psctl_about_this_server(self):
        self.assertEqual(self.run_script("pserver-health.sh", [], {"PSERVER_PORT": "7100"}),
                         ["health", "-servers", "127.0.0.1:7100", "-timeout", "5s"])
        args = self.run_script("pserver-health.sh", ["3s"], {
            "PSERVER_TLS_CERT": "/t/tls.crt", "PSERVER_TLS_KEY": "/t/tls.key",
            "PSERVER_TLS_CA": "/t/ca.crt", "PSERVER_ADVERTISE_HOST": "pserver-1.pserver.ns.svc"})
        self.assertEqual(args, ["health", "-servers", "127.0.0.1:7000", "-timeout", "3s",
                                "-tls_cert", "/t/tls.crt", "-tls_key", "/t/tls.key",
                                "-tls_ca", "/t/ca.crt",
                                "-tls_server_name", "pserver-1.pserver.ns.svc"])
        flags = {a[1:] for a in args if a.startswith("-")}
        psctl_flags = psctl_health_flags()
        self.assertLessEqual(flags, psctl_flags, f"psctl health lacks {flags - psctl_flags}")

    def test_etcd_member_names_itself_and_every_peer(self):
        args = self.run_script("etcd-member.sh", [], {"ETCD_REPLICAS": "3", "ETCD_SERVICE": "etcd"})
        pairs = dict(zip(args[0::2], args[1::2]))
        self.assertEqual(pairs["--name"], "etcd-2")
        self.assertEqual(pairs["--advertise-client-urls"], "http://etcd-2.etcd:2379")
        self.assertEqual(pairs["--initial-advertise-peer-urls"], "http://etcd-2.etcd:2380")
        self.assertEqual(pairs["--initial-cluster"],
                         "etcd-0=http://etcd-0.etcd:2380,etcd-1=http://etcd-1.etcd:2380,"
                         "etcd-2=http://etcd-2.etcd:2380")

    def test_etcd_member_refuses_a_bad_replica_count(self):
        result = subprocess.run([os.path.join(ROOT, "deploy", "image", "etcd-member.sh")],
                                capture_output=True, text=True, timeout=60,
                                env={"PATH": f"{self.dir}:/usr/bin:/bin", "ETCD_REPLICAS": "three",
                                     "ETCD_SERVICE": "etcd"})
        self.assertEqual(result.returncode, 2)
        self.assertIn("ETCD_REPLICAS must be a positive integer, got 'three'", result.stderr)
        self.assertFalse(os.path.exists(self.log))


if __name__ == "__main__":
    unittest.main()
