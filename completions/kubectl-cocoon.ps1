
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'kubectl-cocoon' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'kubectl-cocoon'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'kubectl-cocoon' {
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show CocoonSets (all in the namespace, or the named ones with their members)')
            [CompletionResult]::new('describe', 'describe', [CompletionResultType]::ParameterValue, 'Show a CocoonSet, a pod or a CocoonHibernation with its conditions and Events')
            [CompletionResult]::new('wait', 'wait', [CompletionResultType]::ParameterValue, 'Wait (read-only) until targets reach a phase, e.g. cocoonset/NAME --for=Suspended')
            [CompletionResult]::new('suspend', 'suspend', [CompletionResultType]::ParameterValue, 'Suspend CocoonSets: hibernate every VM to the registry (spec.suspend=true)')
            [CompletionResult]::new('resume', 'resume', [CompletionResultType]::ParameterValue, 'Resume suspended CocoonSets (spec.suspend=false)')
            [CompletionResult]::new('hibernate', 'hibernate', [CompletionResultType]::ParameterValue, 'Hibernate pods through their CocoonHibernation (created if missing, named after the pod)')
            [CompletionResult]::new('wake', 'wake', [CompletionResultType]::ParameterValue, 'Wake hibernated pods (CocoonHibernation desire=Wake); `wake cocoonset/NAME` resumes a set')
            [CompletionResult]::new('checkpoint', 'checkpoint', [CompletionResultType]::ParameterValue, 'Save a running pod''s (or a set''s main agent''s) VM to the registry as a CocoonCheckpoint')
            [CompletionResult]::new('fork', 'fork', [CompletionResultType]::ParameterValue, 'Start COUNT independent CocoonSets (PREFIX-1 … PREFIX-COUNT) from a checkpoint')
            [CompletionResult]::new('migrate', 'migrate', [CompletionResultType]::ParameterValue, 'Move a set''s main agent to NODE (spec.nodeName); --cancel restores the previous pin')
            [CompletionResult]::new('pin', 'pin', [CompletionResultType]::ParameterValue, 'Pin a set''s main agent to NODE (same as migrate --to NODE)')
            [CompletionResult]::new('unpin', 'unpin', [CompletionResultType]::ParameterValue, 'Remove a set''s pin (spec.nodeName)')
            [CompletionResult]::new('logs', 'logs', [CompletionResultType]::ParameterValue, 'Show a member''s guest log through the API server (pods/log)')
            [CompletionResult]::new('report', 'report', [CompletionResultType]::ParameterValue, 'Write a support bundle (tar.gz) of one CocoonSet, secrets redacted')
            [CompletionResult]::new('registry', 'registry', [CompletionResultType]::ParameterValue, 'Registry maintenance')
            [CompletionResult]::new('version', 'version', [CompletionResultType]::ParameterValue, 'Print the plugin and operator versions')
            [CompletionResult]::new('completion', 'completion', [CompletionResultType]::ParameterValue, 'Print a static completion script for bash, zsh, fish or powershell')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'kubectl-cocoon;status' {
            [CompletionResult]::new('-A', '-A ', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('--all-namespaces', '--all-namespaces', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('-l', '-l', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--selector', '--selector', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Output format: wide (members too), json, yaml (the computed view: each set with its members, VMs, nodes, lifecycle and hibernations), name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Output format: wide (members too), json, yaml (the computed view: each set with its members, VMs, nodes, lifecycle and hibernations), name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--no-headers', '--no-headers', [CompletionResultType]::ParameterName, 'Print tables without their header line (--no-headers=true|false)')
            [CompletionResult]::new('-w', '-w', [CompletionResultType]::ParameterName, 'Watch: redraw on change (TTY) or stream one JSON object per change (-w=true|false)')
            [CompletionResult]::new('--watch', '--watch', [CompletionResultType]::ParameterName, 'Watch: redraw on change (TTY) or stream one JSON object per change (-w=true|false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;describe' {
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'kubectl-cocoon;wait' {
            [CompletionResult]::new('--for', '--for', [CompletionResultType]::ParameterName, 'The phase to wait for: Suspended, Running, …; for pods Hibernated, Active, Ready')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget (0 checks once)')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object(s); several as a List')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object(s); several as a List')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'kubectl-cocoon;suspend' {
            [CompletionResult]::new('-A', '-A ', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('--all-namespaces', '--all-namespaces', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('-l', '-l', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--selector', '--selector', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--until', '--until', [CompletionResultType]::ParameterName, 'The CocoonSet phase that counts as success instead of Suspended')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;resume' {
            [CompletionResult]::new('-A', '-A ', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('--all-namespaces', '--all-namespaces', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('-l', '-l', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--selector', '--selector', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--until', '--until', [CompletionResultType]::ParameterName, 'The CocoonSet phase that counts as success instead of Running')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;hibernate' {
            [CompletionResult]::new('--until', '--until', [CompletionResultType]::ParameterName, 'The CocoonHibernation phase that counts as success instead of Hibernated')
            [CompletionResult]::new('-A', '-A ', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('--all-namespaces', '--all-namespaces', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('-l', '-l', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--selector', '--selector', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;wake' {
            [CompletionResult]::new('--until', '--until', [CompletionResultType]::ParameterName, 'The phase that counts as success: a CocoonHibernation phase for pods (default Active), a CocoonSet phase for cocoonset/NAME (default Running)')
            [CompletionResult]::new('-A', '-A ', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('--all-namespaces', '--all-namespaces', [CompletionResultType]::ParameterName, 'Act in all namespaces (-A, -A=true, --all-namespaces=false)')
            [CompletionResult]::new('-l', '-l', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--selector', '--selector', [CompletionResultType]::ParameterName, 'Label selector (e.g. -l team=a)')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;checkpoint' {
            [CompletionResult]::new('--name', '--name', [CompletionResultType]::ParameterName, 'The CocoonCheckpoint''s name')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            break
        }
        'kubectl-cocoon;fork' {
            [CompletionResult]::new('--count', '--count', [CompletionResultType]::ParameterName, 'How many sets (1-100)')
            [CompletionResult]::new('--name', '--name', [CompletionResultType]::ParameterName, 'Name prefix of the sets [default: CKPT]')
            [CompletionResult]::new('--replicas', '--replicas', [CompletionResultType]::ParameterName, 'Sub-agents of each set')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;migrate' {
            [CompletionResult]::new('--to', '--to', [CompletionResultType]::ParameterName, 'The target node')
            [CompletionResult]::new('--cancel', '--cancel', [CompletionResultType]::ParameterName, 'Restore the pin that was in place before the last migrate/pin (--cancel=true|false)')
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;pin' {
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;unpin' {
            [CompletionResult]::new('--wait', '--wait', [CompletionResultType]::ParameterName, 'Wait for the phase to settle (the default); --wait=false returns right after the write')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Overall wait budget')
            [CompletionResult]::new('--failure-grace', '--failure-grace', [CompletionResultType]::ParameterName, 'How long Failed must persist before it counts (the operator retries from Failed)')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Print the final object: json, yaml, name or jsonpath=TEMPLATE')
            [CompletionResult]::new('--dry-run', '--dry-run', [CompletionResultType]::ParameterName, 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client')
            [CompletionResult]::new('--field-manager', '--field-manager', [CompletionResultType]::ParameterName, 'Name of the manager recorded in managedFields for every write')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask before acting on several objects (-y, -y=true, --yes=false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--no-wait', '--no-wait', [CompletionResultType]::ParameterName, 'Same as --wait=false')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;logs' {
            [CompletionResult]::new('--slot', '--slot', [CompletionResultType]::ParameterName, 'The agent slot (0 is the main agent, the default)')
            [CompletionResult]::new('--toolbox', '--toolbox', [CompletionResultType]::ParameterName, 'A toolbox by name instead of an agent slot')
            [CompletionResult]::new('-f', '-f', [CompletionResultType]::ParameterName, 'Keep streaming new lines (-f, -f=true, --follow=false)')
            [CompletionResult]::new('--follow', '--follow', [CompletionResultType]::ParameterName, 'Keep streaming new lines (-f, -f=true, --follow=false)')
            [CompletionResult]::new('--tail', '--tail', [CompletionResultType]::ParameterName, 'Lines from the end of the log to show (the node agent''s default when unset)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;report' {
            [CompletionResult]::new('--file', '--file', [CompletionResultType]::ParameterName, 'Where to write the bundle [default: ./cocoon-report-NS-NAME-TIME.tar.gz]')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;registry' {
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('gc', 'gc', [CompletionResultType]::ParameterValue, 'Delete :hibernate tags (and :latest with --include-latest) of VM repositories, and :checkpoint tags of checkpoint repositories, that no live CocoonSet, CocoonHibernation, CocoonCheckpoint or pod references. Dry run unless --yes')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'kubectl-cocoon;registry;gc' {
            [CompletionResult]::new('--registry', '--registry', [CompletionResultType]::ParameterName, 'Registry base (host[:port][/prefix]); defaults to OCI_REGISTRY')
            [CompletionResult]::new('--include-latest', '--include-latest', [CompletionResultType]::ParameterName, 'Also collect unreferenced :latest tags (kept after teardown by snapshotPolicy); --include-latest=true|false')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Delete (without it, only list what would be deleted); -y=true, --yes=false')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Delete (without it, only list what would be deleted); -y=true, --yes=false')
            [CompletionResult]::new('-i', '-i', [CompletionResultType]::ParameterName, 'Show what would be deleted, then ask (on stderr, answered on stdin) before deleting; -i=true, --interactive=false')
            [CompletionResult]::new('--interactive', '--interactive', [CompletionResultType]::ParameterName, 'Show what would be deleted, then ask (on stderr, answered on stdin) before deleting; -i=true, --interactive=false')
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Output format: json, yaml or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Output format: json, yaml or jsonpath=TEMPLATE')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;registry;help' {
            [CompletionResult]::new('gc', 'gc', [CompletionResultType]::ParameterValue, 'Delete :hibernate tags (and :latest with --include-latest) of VM repositories, and :checkpoint tags of checkpoint repositories, that no live CocoonSet, CocoonHibernation, CocoonCheckpoint or pod references. Dry run unless --yes')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'kubectl-cocoon;registry;help;gc' {
            break
        }
        'kubectl-cocoon;registry;help;help' {
            break
        }
        'kubectl-cocoon;version' {
            [CompletionResult]::new('-o', '-o', [CompletionResultType]::ParameterName, 'Output format: json, yaml or jsonpath=TEMPLATE')
            [CompletionResult]::new('--output', '--output', [CompletionResultType]::ParameterName, 'Output format: json, yaml or jsonpath=TEMPLATE')
            [CompletionResult]::new('--client', '--client', [CompletionResultType]::ParameterName, 'Print only the plugin''s version and revision; do not contact the cluster (--client=true|false)')
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;completion' {
            [CompletionResult]::new('--kubeconfig', '--kubeconfig', [CompletionResultType]::ParameterName, 'Path to the kubeconfig file to use')
            [CompletionResult]::new('--context', '--context', [CompletionResultType]::ParameterName, 'The name of the kubeconfig context to use')
            [CompletionResult]::new('--cluster', '--cluster', [CompletionResultType]::ParameterName, 'The name of the kubeconfig cluster to use')
            [CompletionResult]::new('--user', '--user', [CompletionResultType]::ParameterName, 'The name of the kubeconfig user to use')
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'The namespace scope for this request')
            [CompletionResult]::new('-s', '-s', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--server', '--server', [CompletionResultType]::ParameterName, 'The address and port of the Kubernetes API server')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'Bearer token for authentication to the API server')
            [CompletionResult]::new('--as', '--as', [CompletionResultType]::ParameterName, 'Username to impersonate for the operation')
            [CompletionResult]::new('--as-group', '--as-group', [CompletionResultType]::ParameterName, 'Group to impersonate for the operation (repeatable)')
            [CompletionResult]::new('--as-uid', '--as-uid', [CompletionResultType]::ParameterName, 'UID to impersonate for the operation')
            [CompletionResult]::new('--certificate-authority', '--certificate-authority', [CompletionResultType]::ParameterName, 'Path to a cert file for the certificate authority')
            [CompletionResult]::new('--client-certificate', '--client-certificate', [CompletionResultType]::ParameterName, 'Path to a client certificate file for TLS')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Path to a client key file for TLS')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Server name to use for server certificate validation')
            [CompletionResult]::new('--request-timeout', '--request-timeout', [CompletionResultType]::ParameterName, 'The length of time to wait before giving up on a single server request (e.g. 30s)')
            [CompletionResult]::new('--color', '--color', [CompletionResultType]::ParameterName, 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never')
            [CompletionResult]::new('--insecure-skip-tls-verify', '--insecure-skip-tls-verify', [CompletionResultType]::ParameterName, 'If true, the server''s certificate will not be checked for validity')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            break
        }
        'kubectl-cocoon;help' {
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show CocoonSets (all in the namespace, or the named ones with their members)')
            [CompletionResult]::new('describe', 'describe', [CompletionResultType]::ParameterValue, 'Show a CocoonSet, a pod or a CocoonHibernation with its conditions and Events')
            [CompletionResult]::new('wait', 'wait', [CompletionResultType]::ParameterValue, 'Wait (read-only) until targets reach a phase, e.g. cocoonset/NAME --for=Suspended')
            [CompletionResult]::new('suspend', 'suspend', [CompletionResultType]::ParameterValue, 'Suspend CocoonSets: hibernate every VM to the registry (spec.suspend=true)')
            [CompletionResult]::new('resume', 'resume', [CompletionResultType]::ParameterValue, 'Resume suspended CocoonSets (spec.suspend=false)')
            [CompletionResult]::new('hibernate', 'hibernate', [CompletionResultType]::ParameterValue, 'Hibernate pods through their CocoonHibernation (created if missing, named after the pod)')
            [CompletionResult]::new('wake', 'wake', [CompletionResultType]::ParameterValue, 'Wake hibernated pods (CocoonHibernation desire=Wake); `wake cocoonset/NAME` resumes a set')
            [CompletionResult]::new('checkpoint', 'checkpoint', [CompletionResultType]::ParameterValue, 'Save a running pod''s (or a set''s main agent''s) VM to the registry as a CocoonCheckpoint')
            [CompletionResult]::new('fork', 'fork', [CompletionResultType]::ParameterValue, 'Start COUNT independent CocoonSets (PREFIX-1 … PREFIX-COUNT) from a checkpoint')
            [CompletionResult]::new('migrate', 'migrate', [CompletionResultType]::ParameterValue, 'Move a set''s main agent to NODE (spec.nodeName); --cancel restores the previous pin')
            [CompletionResult]::new('pin', 'pin', [CompletionResultType]::ParameterValue, 'Pin a set''s main agent to NODE (same as migrate --to NODE)')
            [CompletionResult]::new('unpin', 'unpin', [CompletionResultType]::ParameterValue, 'Remove a set''s pin (spec.nodeName)')
            [CompletionResult]::new('logs', 'logs', [CompletionResultType]::ParameterValue, 'Show a member''s guest log through the API server (pods/log)')
            [CompletionResult]::new('report', 'report', [CompletionResultType]::ParameterValue, 'Write a support bundle (tar.gz) of one CocoonSet, secrets redacted')
            [CompletionResult]::new('registry', 'registry', [CompletionResultType]::ParameterValue, 'Registry maintenance')
            [CompletionResult]::new('version', 'version', [CompletionResultType]::ParameterValue, 'Print the plugin and operator versions')
            [CompletionResult]::new('completion', 'completion', [CompletionResultType]::ParameterValue, 'Print a static completion script for bash, zsh, fish or powershell')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'kubectl-cocoon;help;status' {
            break
        }
        'kubectl-cocoon;help;describe' {
            break
        }
        'kubectl-cocoon;help;wait' {
            break
        }
        'kubectl-cocoon;help;suspend' {
            break
        }
        'kubectl-cocoon;help;resume' {
            break
        }
        'kubectl-cocoon;help;hibernate' {
            break
        }
        'kubectl-cocoon;help;wake' {
            break
        }
        'kubectl-cocoon;help;checkpoint' {
            break
        }
        'kubectl-cocoon;help;fork' {
            break
        }
        'kubectl-cocoon;help;migrate' {
            break
        }
        'kubectl-cocoon;help;pin' {
            break
        }
        'kubectl-cocoon;help;unpin' {
            break
        }
        'kubectl-cocoon;help;logs' {
            break
        }
        'kubectl-cocoon;help;report' {
            break
        }
        'kubectl-cocoon;help;registry' {
            [CompletionResult]::new('gc', 'gc', [CompletionResultType]::ParameterValue, 'Delete :hibernate tags (and :latest with --include-latest) of VM repositories, and :checkpoint tags of checkpoint repositories, that no live CocoonSet, CocoonHibernation, CocoonCheckpoint or pod references. Dry run unless --yes')
            break
        }
        'kubectl-cocoon;help;registry;gc' {
            break
        }
        'kubectl-cocoon;help;version' {
            break
        }
        'kubectl-cocoon;help;completion' {
            break
        }
        'kubectl-cocoon;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
