//! The text after each verb's options in `--help`: examples people type (CI use included),
//! what the verb waits for and its exit codes.

/// Exit codes of the verbs that write and wait.
macro_rules! wait_exit_codes {
    () => {
        "Exit codes:\n  0  success (also: already in the requested state)\n  1  error (API error, RBAC denial, not found)\n  2  usage error\n  3  the wait timed out\n  4  the wait reached Failed (after --failure-grace)\n  130  interrupted (Ctrl-C) while waiting; the write already happened\n\nSeveral targets are all written first, then waited for together under one --timeout;\nthe exit code is the worst of theirs (4 over 3 over 1)."
    };
}

/// Exit codes of the read-only `wait` verb: the same outcomes, but nothing is written.
macro_rules! read_wait_exit_codes {
    () => {
        "Exit codes:\n  0  success (already in the phase, or reached it)\n  1  error (API error, RBAC denial, not found)\n  2  usage error\n  3  the wait timed out (with --timeout 0: not in the phase now)\n  4  the wait reached Failed (after --failure-grace)\n  130  interrupted (Ctrl-C); nothing was written\n\nSeveral targets are waited for together under one --timeout;\nthe exit code is the worst of theirs (4 over 3 over 1)."
    };
}

/// Exit codes of the verbs that only read.
macro_rules! read_exit_codes {
    () => {
        "Exit codes:\n  0  success\n  1  error (API error, RBAC denial, not found)\n  2  usage error"
    };
}

/// Exit codes of every verb (the top-level help).
pub const EXIT_CODES: &str = wait_exit_codes!();

pub const TOP: &str = concat!(
    "Examples:\n",
    "  # What runs where\n",
    "  kubectl cocoon status\n\n",
    "  # Suspend a set and wait until it reads Suspended; 3 = timed out, 4 = Failed\n",
    "  kubectl cocoon suspend demo --timeout 5m\n\n",
    "Connection options are shared by every verb (kubectl's own flags).\n\n",
    wait_exit_codes!()
);

pub const STATUS: &str = concat!(
    "Examples:\n",
    "  # Every set in the namespace\n",
    "  kubectl cocoon status\n\n",
    "  # One set with its members (pods, VMs, nodes, lifecycle, hibernations)\n",
    "  kubectl cocoon status demo\n\n",
    "  # The computed view as JSON, for scripts\n",
    "  kubectl cocoon status demo -o json\n\n",
    "  # In CI: the phase of a set, nothing else\n",
    "  phase=$(kubectl cocoon status demo -o jsonpath='{.items[0].status.phase}')\n\n",
    "  # Every namespace, redrawn on change\n",
    "  kubectl cocoon status -A -w\n\n",
    "Waits for: nothing (read-only).\n\n",
    read_exit_codes!()
);

pub const DESCRIBE: &str = concat!(
    "Examples:\n",
    "  # Members, conditions and recent events of a set\n",
    "  kubectl cocoon describe demo\n\n",
    "  # In CI, after a failed step: keep what the operator said (exit 1 if the set is gone)\n",
    "  kubectl cocoon describe demo > artifacts/describe.txt || echo \"describe failed: $?\"\n\n",
    "Waits for: nothing (read-only).\n\n",
    read_exit_codes!()
);

pub const WAIT: &str = concat!(
    "Examples:\n",
    "  # Wait until a set reads Suspended (written by someone else, e.g. a pipeline step)\n",
    "  kubectl cocoon wait cocoonset/demo --for=Suspended\n\n",
    "  # A pod through its CocoonHibernation: hibernated, or woken and serving again\n",
    "  kubectl cocoon wait pod/demo-0 --for=Hibernated\n",
    "  kubectl cocoon wait pod/demo-0 --for=Ready --timeout 2m\n\n",
    "  # In CI: check once, without waiting (exit 3 if not there yet)\n",
    "  kubectl cocoon wait cocoonset/demo --for=Running --timeout 0 || echo \"not running yet (exit $?)\"\n\n",
    "Waits for: the phase given with --for, of every target, under one --timeout.\n\n",
    read_wait_exit_codes!()
);

pub const SUSPEND: &str = concat!(
    "Examples:\n",
    "  # Suspend a set and wait until it reads Suspended\n",
    "  kubectl cocoon suspend demo\n\n",
    "  # Every set labelled team=a, without the prompt\n",
    "  kubectl cocoon suspend -l team=a -y\n\n",
    "  # Ask the API server what it would do, change nothing\n",
    "  kubectl cocoon suspend demo --dry-run=server\n\n",
    "  # Write and return at once\n",
    "  kubectl cocoon suspend demo --wait=false\n\n",
    "  # In CI: fail the job unless the set is Suspended within 5 minutes\n",
    "  kubectl cocoon suspend demo --timeout 5m || { rc=$?; echo \"suspend failed (exit $rc: 3 timed out, 4 Failed)\"; exit $rc; }\n\n",
    "Waits for: the CocoonSet phase Suspended at the new generation (--until PHASE to change it).\n\n",
    wait_exit_codes!()
);

pub const CHECKPOINT: &str = concat!(
    "Examples:\n",
    "  # Save a set's main agent to the registry under the name before-refactor; it keeps running\n",
    "  kubectl cocoon checkpoint cocoonset/demo --name before-refactor\n\n",
    "  # A pod (a set member or a raw managed pod), without waiting\n",
    "  kubectl cocoon checkpoint demo-0 --name good --wait=false\n\n",
    "  # Print the CocoonCheckpoint it would create, send nothing\n",
    "  kubectl cocoon checkpoint demo-0 --name good --dry-run=client -o yaml\n\n",
    "  # In CI: checkpoint, then fork only if it is Ready within 10 minutes\n",
    "  kubectl cocoon checkpoint cocoonset/demo --name run-42 --timeout 10m && kubectl cocoon fork run-42 --count 5\n\n",
    "Waits for: the CocoonCheckpoint phase Ready (the artifact pushed and verified), with the\n",
    "bytes on the wire as progress.\n\n",
    wait_exit_codes!()
);

pub const FORK: &str = concat!(
    "Examples:\n",
    "  # Three independent copies of a checkpoint: sets good-1, good-2, good-3\n",
    "  kubectl cocoon fork good --count 3\n\n",
    "  # Ten copies named try-1 ... try-10, two sub-agents each, without waiting\n",
    "  kubectl cocoon fork good --count 10 --name try --replicas 2 --wait=false\n\n",
    "  # Print the CocoonSets it would create, send nothing\n",
    "  kubectl cocoon fork good --count 2 --dry-run=client -o yaml\n\n",
    "  # In CI: five parallel attempts from one checkpoint, each set's node printed\n",
    "  kubectl cocoon fork run-42 --count 5 --name attempt --timeout 15m || echo \"fork failed (exit $?)\"\n\n",
    "Each set copies the spec of the checkpoint's source set (pin and suspend dropped) or, for a\n",
    "checkpoint of a raw pod, gets a minimal clone-mode agent spec; spec.agent.fromCheckpoint\n",
    "names the checkpoint.\n\n",
    "Waits for: the CocoonSet phase Running of every set; prints each set's node.\n\n",
    wait_exit_codes!()
);

pub const RESUME: &str = concat!(
    "Examples:\n",
    "  # Resume a set and wait until it reads Running\n",
    "  kubectl cocoon resume demo\n\n",
    "  # Resume every set in every namespace, without the prompt\n",
    "  kubectl cocoon resume -A -y\n\n",
    "  # In CI: resume, give up after 10 minutes (exit 3) or on Failed (exit 4)\n",
    "  kubectl cocoon resume demo --timeout 10m\n\n",
    "Waits for: the CocoonSet phase Running at the new generation (--until PHASE to change it).\n\n",
    wait_exit_codes!()
);

pub const HIBERNATE: &str = concat!(
    "Examples:\n",
    "  # Hibernate one pod's VM to the registry\n",
    "  kubectl cocoon hibernate demo-0\n\n",
    "  # Print the CocoonHibernation it would create, send nothing\n",
    "  kubectl cocoon hibernate demo-0 --dry-run=client -o yaml\n\n",
    "  # In CI: hibernate and branch on the outcome\n",
    "  kubectl cocoon hibernate demo-0 --timeout 3m; case $? in 0) ;; 3) echo timed out ;; 4) echo failed ;; esac\n\n",
    "Waits for: the CocoonHibernation phase Hibernated at the new generation (--until PHASE to change it).\n\n",
    wait_exit_codes!()
);

pub const WAKE: &str = concat!(
    "Examples:\n",
    "  # Wake a hibernated pod\n",
    "  kubectl cocoon wake demo-0\n\n",
    "  # Resume a whole set (same as resume demo)\n",
    "  kubectl cocoon wake cocoonset/demo\n\n",
    "  # In CI: wake, then run the job only if it worked\n",
    "  kubectl cocoon wake demo-0 --timeout 2m && ./run-tests.sh\n\n",
    "Waits for: the CocoonHibernation phase Active for pods, the CocoonSet phase Running for\n",
    "cocoonset/NAME (--until PHASE to change it).\n\n",
    wait_exit_codes!()
);

pub const MIGRATE: &str = concat!(
    "Examples:\n",
    "  # Move the main agent of demo to node-b\n",
    "  kubectl cocoon migrate demo --to node-b\n\n",
    "  # Go back to the pin that was in place before\n",
    "  kubectl cocoon migrate demo --cancel\n\n",
    "  # In CI: migrate within 10 minutes or fail the job (exit 3 timed out, 4 Failed)\n",
    "  kubectl cocoon migrate demo --to node-b --timeout 10m\n\n",
    "Waits for: the main agent running with its VM on the new node, the set observed at the new generation.\n\n",
    wait_exit_codes!()
);

pub const PIN: &str = concat!(
    "Examples:\n",
    "  # Keep the main agent of demo on node-a\n",
    "  kubectl cocoon pin demo node-a\n\n",
    "  # In CI: pin without waiting for the move\n",
    "  kubectl cocoon pin demo node-a --wait=false\n\n",
    "Waits for: the main agent running with its VM on NODE, the set observed at the new generation.\n\n",
    wait_exit_codes!()
);

pub const UNPIN: &str = concat!(
    "Examples:\n",
    "  # Let the scheduler place the main agent of demo again\n",
    "  kubectl cocoon unpin demo\n\n",
    "  # In CI: unpin, and fail the job on a timeout (3) or Failed (4)\n",
    "  kubectl cocoon unpin demo --timeout 5m || exit $?\n\n",
    "Waits for: the set observed at the new generation.\n\n",
    wait_exit_codes!()
);

pub const REGISTRY: &str = concat!(
    "Examples:\n",
    "  # List the snapshot tags nothing references\n",
    "  kubectl cocoon registry gc --registry registry.example:5000\n\n",
    read_exit_codes!()
);

pub const REGISTRY_GC: &str = concat!(
    "Examples:\n",
    "  # List what would be deleted (the default)\n",
    "  kubectl cocoon registry gc --registry registry.example:5000\n\n",
    "  # Delete it, :latest tags included\n",
    "  kubectl cocoon registry gc --include-latest --yes\n\n",
    "  # Review the list, then answer y to delete it\n",
    "  kubectl cocoon registry gc -i\n\n",
    "  # In CI: a JSON report of the orphans\n",
    "  kubectl cocoon registry gc -o json\n\n",
    "Only repositories named like VMs (vk-<namespace>-<pod>-<6 hex>) or checkpoints (below)\n",
    "are candidates; images that any CocoonSet or pod uses are never touched. The objects\n",
    "are read again right before each delete, so a tag whose VM became live meanwhile is kept.\n\n",
    "Checkpoint artifacts (ckpt-<namespace>-<name>-<12 hex>:checkpoint) are kept while a\n",
    "CocoonCheckpoint of any namespace derives that repository or an image names it; a\n",
    "checkpoint deleted with its finalizer stripped leaves one that gc collects.\n\n",
    "Waits for: nothing.\n\n",
    read_exit_codes!()
);

pub const VERSION: &str = concat!(
    "Examples:\n",
    "  # The plugin's and the operator's versions\n",
    "  kubectl cocoon version\n\n",
    "  # Offline: only the plugin, no cluster needed\n",
    "  kubectl cocoon version --client -o json\n\n",
    read_exit_codes!()
);

pub const COMPLETION: &str = concat!(
    "Examples:\n",
    "  # bash, for this shell\n",
    "  source <(kubectl cocoon completion bash)\n\n",
    "  # zsh, installed\n",
    "  kubectl cocoon completion zsh > \"${fpath[1]}/_kubectl-cocoon\"\n\n",
    read_exit_codes!()
);

pub const REPORT: &str = concat!(
    "Examples:\n",
    "  # A bundle to attach to a bug report\n",
    "  kubectl cocoon report demo\n\n",
    "  # In CI, after a failed job: keep the bundle as an artifact\n",
    "  kubectl cocoon report demo --file artifacts/cocoon-report.tar.gz\n\n",
    "The bundle holds the set, its pods, hibernations and events, the operator Deployment and its\n",
    "recent logs, the nodes of its members and `version -o json`; secrets and tokens are redacted.\n",
    "A part RBAC refuses is named in NOTES.txt (and on stderr) and the rest is still written.\n\n",
    "Waits for: nothing (read-only).\n\n",
    read_exit_codes!()
);

pub const LOGS: &str = concat!(
    "Examples:\n",
    "  # The main agent's guest log\n",
    "  kubectl cocoon logs demo\n\n",
    "  # Sub-agent 2, following new lines\n",
    "  kubectl cocoon logs demo --slot 2 -f\n\n",
    "  # In CI, after a failed job: the last 100 lines of a toolbox as an artifact\n",
    "  kubectl cocoon logs demo --toolbox browser --tail 100 > artifacts/browser.log\n\n",
    "Waits for: nothing (read-only).\n\n",
    read_exit_codes!()
);
