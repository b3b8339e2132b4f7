#!/usr/bin/env python3
"""Upgrades through `weir operator`, measured on real processes (release build).

A `counter` deployment with 1,000,000 users (every key in state: the job runs until each
user was counted), 2 TaskManagers with 4 slots each, checkpoints every second. Each round
applies a parallelism change and measures from the apply until the new job is RUNNING with
every subtask RUNNING (as the cluster's REST API reports it):

- savepoint mode, p 2 -> 4: stop-with-savepoint, stop the old cluster, start the new one,
  submit from the savepoint (1 M keys redistributed over 128 key groups);
- last-state mode, p 4 -> 3 (and back to 2): cancel, start from the newest checkpoint.

The operator's log gives each step's share. Usage: bench/deploy.sh (ROUNDS=3 by default).
"""
import json, os, re, shutil, subprocess, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIR = os.path.join(ROOT, "target/release/weir")
ROUNDS = int(os.environ.get("ROUNDS", "3"))
USERS = 1_000_000

def get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return json.loads(r.read())
    except Exception:
        return None

def spec(parallelism, mode):
    return f"""apiVersion: weir.dev/v1
kind: WeirDeployment
metadata:
  name: bench
spec:
  binary: {WEIR}
  configuration:
    execution.checkpointing.interval: 1s
  taskManager:
    replicas: 2
    slots: 4
  job:
    name: counter
    args: [--users, "{USERS}", --rate, "2000000", --output, none]
    parallelism: {parallelism}
    upgradeMode: {mode}
"""

class Bench:
    def __init__(self):
        self.work = tempfile.mkdtemp()
        self.env = dict(os.environ, WEIR_DATA_DIR=f"{self.work}/data", WEIR_LOG="off")
        self.env.pop("WEIR_CONF_DIR", None)
        self.log = open(f"{self.work}/operator.log", "w")
        self.operator = subprocess.Popen([WEIR, "operator", "-D", "operator.rest.port=0"], stdout=self.log,
                                         stderr=self.log, env=dict(self.env, WEIR_LOG="info"))

    def apply(self, parallelism, mode):
        path = f"{self.work}/bench.yaml"
        open(path, "w").write(spec(parallelism, mode))
        subprocess.run([WEIR, "deployment", "apply", "-f", path], env=self.env, check=True, capture_output=True)

    def status(self):
        out = subprocess.run([WEIR, "deployment", "get", "bench", "-o", "json"], env=self.env, capture_output=True, text=True)
        try:
            return json.loads(out.stdout)
        except Exception:
            return {}

    def running(self, generation):
        s = self.status().get("status", {})
        if s.get("observedGeneration") != generation or s.get("operation"):
            return None
        cluster, job = s.get("clusterInfo"), s.get("jobStatus", {}).get("jobId")
        if not cluster or not job:
            return None
        j = get(f"{cluster['restAddress']}/jobs/{job}")
        if not j or j.get("state") != "RUNNING":
            return None
        if all(t["status"] == "RUNNING" for v in j["vertices"] for t in v["subtasks"]):
            return (cluster["restAddress"], job)
        return None

    def wait(self, predicate, within=300):
        deadline = time.time() + within
        while time.time() < deadline:
            value = predicate()
            if value:
                return value
            time.sleep(0.002)
        raise SystemExit("timed out; see " + self.log.name)

    def stop(self):
        self.operator.kill()
        self.operator.wait()
        for d in sorted(os.listdir(f"{self.work}/data/deployments/bench/clusters")):
            subprocess.run(["pkill", "-f", f"{self.work}/data/deployments/bench/clusters/{d}/config.yaml"])
        time.sleep(0.5)
        shutil.rmtree(self.work, ignore_errors=True)

def keys_in_state(rest, job):
    """Users counted so far: the source has read at least USERS events once reads pass it."""
    j = get(f"{rest}/jobs/{job}")
    return sum(t["metrics"]["read-records"] for v in j["vertices"] if v["name"].startswith("Source") for t in v["subtasks"]) if j else 0

def steps(log_text, since):
    """The operator log's step timestamps after `since` (a line count)."""
    lines = log_text.splitlines()[since:]
    marks = []
    for line in lines:
        m = re.match(r"(\S+Z)\s+INFO (.*?) deployment=", line)
        if m:
            marks.append((m.group(1), m.group(2)))
    return marks

if __name__ == "__main__":
    print("machine:", os.cpu_count(), "cores")
    b = Bench()
    try:
        b.apply(2, "savepoint")
        rest, job = b.wait(lambda: b.running(1))
        b.wait(lambda: keys_in_state(rest, job) >= USERS, within=120)
        generation = 1
        results = {"savepoint": [], "last-state": []}
        plan = []
        for _ in range(ROUNDS):
            plan += [(4, "savepoint"), (3, "last-state"), (2, "savepoint"), (4, "last-state"), (2, "last-state")]
        for parallelism, mode in plan[: ROUNDS * 2 + 1]:
            time.sleep(2)  # a checkpoint of the full state completes
            before = len(open(b.log.name).read().splitlines())
            t0 = time.time()
            b.apply(parallelism, mode)
            generation += 1
            b.wait(lambda: b.running(generation))
            took = time.time() - t0
            results[mode].append(took)
            marks = steps(open(b.log.name).read(), before)
            print(f"{mode:10} -> p={parallelism}: apply to RUNNING {took*1000:.0f} ms")
            if marks:
                from datetime import datetime
                at = lambda stamp: datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                for stamp, text in marks:
                    print(f"    +{(at(stamp) - t0) * 1000:5.0f} ms  {text[:110]}")
        for mode, times in results.items():
            if times:
                times.sort()
                print(f"{mode}: median {times[len(times)//2]*1000:.0f} ms over {len(times)} upgrades (min {times[0]*1000:.0f}, max {times[-1]*1000:.0f})")
    finally:
        b.stop()
