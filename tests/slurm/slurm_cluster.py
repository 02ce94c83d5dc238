"""A throwaway Slurm cluster on this machine: munged + slurmctld + slurmd in the foreground, each a child
process of ours (stopped by its own pid), with their own config, state, spool, log dirs and ports.

    python tests/slurm/slurm_cluster.py DIR   # start one by hand, print the SLURM_CONF to export, wait for Ctrl-C
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sacct")


def missing_binaries() -> list[str]:
    return [b for b in (*DAEMONS, *CLIENTS[:4]) if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def _which(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin") / name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=specdraft-test
SlurmctldHost={host}({addr})
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool/%n
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd-%n.pid
SlurmctldLogFile={dir}/log/slurmctld.log
SlurmdLogFile={dir}/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=kill_invalid_depend
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
JobRequeue=1
KillWait=10
InactiveLimit=0
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class Cluster:
    """Start with start(); env() is what a client command needs (SLURM_CONF); stop() ends our daemons."""

    def __init__(self, root: Path, nodes: list[tuple[str, str]] | None = None, cpus: int = 2,
                 ctld_addr: str = "127.0.0.1", netns: dict[str, str] | None = None, ctld_netns: str | None = None):
        """nodes: (NodeName, NodeAddr) pairs; netns: NodeName -> network namespace its slurmd runs in;
        ctld_netns: the namespace of slurmctld and of every client command (sbatch, squeue, ...)."""
        self.root = Path(root)
        self.ctld_addr = ctld_addr
        self.netns = netns or {}
        self.client_prefix = ["nsenter", f"--net=/run/netns/{ctld_netns}"] if ctld_netns else []
        self.host = socket.gethostname()
        self.nodes = nodes or [(self.host, "127.0.0.1")]  # (NodeName, NodeAddr)
        self.cpus = cpus
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"

    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def _write_config(self) -> None:
        for d in ("state", "spool", "log", "munge"):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        os.chmod(self.root / "munge", 0o700)
        nodes = "\n".join(f"NodeName={name} NodeAddr={addr} NodeHostname={name} CPUs={self.cpus} State=UNKNOWN"
                          for name, addr in self.nodes)
        self.conf.write_text(SLURM_CONF.format(host=self.host, addr=self.ctld_addr, ctld_port=_free_port(),
                                               slurmd_port=_free_port(), munge_socket=self.munge_socket,
                                               dir=self.root, nodes=nodes))

    def _spawn(self, name: str, argv: list[str], prefix: list[str] | None = None) -> None:
        log = open(self.root / "log" / f"{name}.stdout", "w")
        self.procs[name] = subprocess.Popen([*(prefix or []), *argv], stdout=log, stderr=subprocess.STDOUT,
                                            env=self.env(), start_new_session=True)

    def start_munge(self) -> None:
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        self._spawn("munged", [_which("munged"), "--foreground", "--force", f"--key-file={key}",
                               f"--socket={self.munge_socket}", f"--pid-file={self.root}/munge/munged.pid",
                               f"--seed-file={self.root}/munge/munged.seed", f"--log-file={self.root}/log/munged.log"])
        self._wait(lambda: self.munge_socket.exists(), "munged socket", 20)

    def start(self) -> "Cluster":
        self._write_config()
        try:
            self.start_munge()
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(self.conf)], self.client_prefix)
            self._wait(self._ctld_up, "slurmctld", 30)
            for name, _ in self.nodes:
                (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
                self._spawn(f"slurmd-{name}", [_which("slurmd"), "-D", "-f", str(self.conf), "-N", name],
                            ["nsenter", f"--net=/run/netns/{self.netns[name]}"] if name in self.netns else None)
            self._wait(self.nodes_idle, "slurmd node(s) idle", 60)
        except BaseException:
            self.stop()
            raise
        return self

    def _ctld_up(self) -> bool:
        return self.run("scontrol", "ping", check=False).count("UP") > 0

    def nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
        states = dict(line.split() for line in out.splitlines() if line.strip())
        return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

    def _wait(self, ok, what: str, timeout: float) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.logs()}")
            if ok():
                return
            time.sleep(0.3)
        raise TimeoutError(f"{what} not ready after {timeout}s:\n{self.logs()}")

    def logs(self, tail: int = 3000) -> str:
        parts = []
        for f in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {f.name}\n{f.read_text(errors='replace')[-tail:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        # slurmd first (it talks to slurmctld on the way down), munged last; each by its own pid
        for name in sorted(self.procs, key=lambda n: (n.startswith("munged"), n.startswith("slurmctld"))):
            p = self.procs[name]
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        self.procs.clear()

    # ---- client helpers -------------------------------------------------------------------------
    def run(self, *argv: str, cwd=None, check: bool = True, env: dict | None = None) -> str:
        proc = subprocess.run([*self.client_prefix, *argv], env={**self.env(), **(env or {})}, cwd=cwd,
                              capture_output=True, text=True)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stdout}{proc.stderr}")
        return proc.stdout

    def job_state(self, job_id: str) -> dict[str, str]:
        """scontrol's view of one job (or array task, "123_4"): JobState, ExitCode, Restarts, ..."""
        out = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", out.splitlines()[0])) if out.strip() else {}

    def wait(self, job_ids: list[str], timeout: float = 300) -> dict[str, dict[str, str]]:
        """Block until every job (array jobs: every task) has left the queue; -> job id -> final state."""
        t0 = time.time()
        while time.time() - t0 < timeout:
            proc = subprocess.run([*self.client_prefix, "squeue", "-h", "-r", "-o", "%i %T"], env=self.env(),
                                  capture_output=True, text=True)
            queued = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
            if proc.returncode == 0 and not any(q == j or q.startswith(f"{j}_") for j in job_ids for q in queued):
                states = {j: self.job_state(j) for j in job_ids}
                if all(s.get("JobState") not in (None, "PENDING", "RUNNING", "COMPLETING", "REQUEUED")
                       for s in states.values()):
                    return states
            time.sleep(1)
        raise TimeoutError(f"jobs {job_ids} still queued after {timeout}s:\n"
                           f"{self.run('squeue', check=False)}\n{self.logs()}")


class TwoHostNetwork:
    """Two network namespaces joined by one veth pair, each end named `sd0` and given an address; nothing is
    configured outside the namespaces this creates (they, and with them the veth pair, are deleted on stop)."""

    def __init__(self, tag: str, subnet: str = "10.213.7"):
        self.names = (f"sd-{tag}-a", f"sd-{tag}-b")
        self.addrs = (f"{subnet}.1", f"{subnet}.2")
        self.ifname = "sd0"

    def _ip(self, *argv: str) -> None:
        subprocess.run(["ip", *argv], check=True, capture_output=True, text=True)

    def start(self) -> "TwoHostNetwork":
        a, b = self.names
        try:
            for ns in self.names:
                self._ip("netns", "add", ns)
            self._ip("link", "add", "sdtmp-a", "netns", a, "type", "veth", "peer", "name", "sdtmp-b", "netns", b)
            for ns, end, addr in ((a, "sdtmp-a", self.addrs[0]), (b, "sdtmp-b", self.addrs[1])):
                self._ip("-n", ns, "link", "set", end, "name", self.ifname)
                self._ip("-n", ns, "addr", "add", f"{addr}/24", "dev", self.ifname)
                self._ip("-n", ns, "link", "set", self.ifname, "up")
                self._ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for ns in self.names:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def main() -> None:
    import signal

    root = Path(sys.argv[1]).resolve()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # `kill PID` stops the daemons too
    cluster = Cluster(root).start()
    print(f"export SLURM_CONF={cluster.conf}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
