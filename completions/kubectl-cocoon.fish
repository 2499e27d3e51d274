# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_kubectl_cocoon_global_optspecs
    string join \n kubeconfig= context= cluster= user= n/namespace= s/server= token= as= as-group= as-uid= certificate-authority= client-certificate= client-key= insecure-skip-tls-verify tls-server-name= request-timeout= color= h/help V/version
end

function __fish_kubectl_cocoon_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_kubectl_cocoon_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_kubectl_cocoon_using_subcommand
    set -l cmd (__fish_kubectl_cocoon_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -s V -l version -d 'Print version'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "status" -d 'Show CocoonSets (all in the namespace, or the named ones with their members)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "describe" -d 'Show a CocoonSet, a pod or a CocoonHibernation with its conditions and Events'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "wait" -d 'Wait (read-only) until targets reach a phase, e.g. cocoonset/NAME --for=Suspended'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "suspend" -d 'Suspend CocoonSets: hibernate every VM to the registry (spec.suspend=true)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "resume" -d 'Resume suspended CocoonSets (spec.suspend=false)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "hibernate" -d 'Hibernate pods through their CocoonHibernation (created if missing, named after the pod)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "wake" -d 'Wake hibernated pods (CocoonHibernation desire=Wake); `wake cocoonset/NAME` resumes a set'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "checkpoint" -d 'Save a running pod\'s (or a set\'s main agent\'s) VM to the registry as a CocoonCheckpoint'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "fork" -d 'Start COUNT independent CocoonSets (PREFIX-1 … PREFIX-COUNT) from a checkpoint'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "migrate" -d 'Move a set\'s main agent to NODE (spec.nodeName); --cancel restores the previous pin'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "pin" -d 'Pin a set\'s main agent to NODE (same as migrate --to NODE)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "unpin" -d 'Remove a set\'s pin (spec.nodeName)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "logs" -d 'Show a member\'s guest log through the API server (pods/log)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "report" -d 'Write a support bundle (tar.gz) of one CocoonSet, secrets redacted'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "registry" -d 'Registry maintenance'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "version" -d 'Print the plugin and operator versions'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "completion" -d 'Print a static completion script for bash, zsh, fish or powershell'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -s A -l all-namespaces -d 'Act in all namespaces (-A, -A=true, --all-namespaces=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -s l -l selector -d 'Label selector (e.g. -l team=a)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -s o -l output -d 'Output format: wide (members too), json, yaml (the computed view: each set with its members, VMs, nodes, lifecycle and hibernations), name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l no-headers -d 'Print tables without their header line (--no-headers=true|false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -s w -l watch -d 'Watch: redraw on change (TTY) or stream one JSON object per change (-w=true|false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand status" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand describe" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l for -d 'The phase to wait for: Suspended, Running, …; for pods Hibernated, Active, Ready' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l timeout -d 'Overall wait budget (0 checks once)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l failure-grace -d 'How long Failed must persist before it counts' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -s o -l output -d 'Print the final object(s); several as a List' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wait" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -s A -l all-namespaces -d 'Act in all namespaces (-A, -A=true, --all-namespaces=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -s l -l selector -d 'Label selector (e.g. -l team=a)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l until -d 'The CocoonSet phase that counts as success instead of Suspended' -r -f -a "Pending\t''
Scaling\t''
Running\t''
Suspending\t''
Suspended\t''
Waking\t''
Migrating\t''
Failed\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand suspend" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -s A -l all-namespaces -d 'Act in all namespaces (-A, -A=true, --all-namespaces=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -s l -l selector -d 'Label selector (e.g. -l team=a)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l until -d 'The CocoonSet phase that counts as success instead of Running' -r -f -a "Pending\t''
Scaling\t''
Running\t''
Suspending\t''
Suspended\t''
Waking\t''
Migrating\t''
Failed\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand resume" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l until -d 'The CocoonHibernation phase that counts as success instead of Hibernated' -r -f -a "Pending\t''
Hibernating\t''
Hibernated\t''
Waking\t''
Active\t''
Failed\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -s A -l all-namespaces -d 'Act in all namespaces (-A, -A=true, --all-namespaces=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -s l -l selector -d 'Label selector (e.g. -l team=a)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand hibernate" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l until -d 'The phase that counts as success: a CocoonHibernation phase for pods (default Active), a CocoonSet phase for cocoonset/NAME (default Running)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -s A -l all-namespaces -d 'Act in all namespaces (-A, -A=true, --all-namespaces=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -s l -l selector -d 'Label selector (e.g. -l team=a)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand wake" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l name -d 'The CocoonCheckpoint\'s name' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand checkpoint" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l count -d 'How many sets (1-100)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l name -d 'Name prefix of the sets [default: CKPT]' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l replicas -d 'Sub-agents of each set' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand fork" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l to -d 'The target node' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l cancel -d 'Restore the pin that was in place before the last migrate/pin (--cancel=true|false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand migrate" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand pin" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l wait -d 'Wait for the phase to settle (the default); --wait=false returns right after the write' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l timeout -d 'Overall wait budget' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l failure-grace -d 'How long Failed must persist before it counts (the operator retries from Failed)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -s o -l output -d 'Print the final object: json, yaml, name or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l dry-run -d 'none, client (print the object as it would be, send nothing) or server (send with dryRun=All); needs `=` (--dry-run=server); bare --dry-run means client' -r -f -a "none\t''
client\t''
server\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l field-manager -d 'Name of the manager recorded in managedFields for every write' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -s y -l yes -d 'Do not ask before acting on several objects (-y, -y=true, --yes=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l no-wait -d 'Same as --wait=false'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand unpin" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l slot -d 'The agent slot (0 is the main agent, the default)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l toolbox -d 'A toolbox by name instead of an agent slot' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -s f -l follow -d 'Keep streaming new lines (-f, -f=true, --follow=false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l tail -d 'Lines from the end of the log to show (the node agent\'s default when unset)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand logs" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l file -d 'Where to write the bundle [default: ./cocoon-report-NS-NAME-TIME.tar.gz]' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand report" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -f -a "gc" -d 'Delete :hibernate tags (and :latest with --include-latest) of VM repositories, and :checkpoint tags of checkpoint repositories, that no live CocoonSet, CocoonHibernation, CocoonCheckpoint or pod references. Dry run unless --yes'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and not __fish_seen_subcommand_from gc help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l registry -d 'Registry base (host[:port][/prefix]); defaults to OCI_REGISTRY' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l include-latest -d 'Also collect unreferenced :latest tags (kept after teardown by snapshotPolicy); --include-latest=true|false' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -s y -l yes -d 'Delete (without it, only list what would be deleted); -y=true, --yes=false' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -s i -l interactive -d 'Show what would be deleted, then ask (on stderr, answered on stdin) before deleting; -i=true, --interactive=false' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -s o -l output -d 'Output format: json, yaml or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from gc" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from help" -f -a "gc" -d 'Delete :hibernate tags (and :latest with --include-latest) of VM repositories, and :checkpoint tags of checkpoint repositories, that no live CocoonSet, CocoonHibernation, CocoonCheckpoint or pod references. Dry run unless --yes'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand registry; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -s o -l output -d 'Output format: json, yaml or jsonpath=TEMPLATE' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l client -d 'Print only the plugin\'s version and revision; do not contact the cluster (--client=true|false)' -r -f -a "true\t''
false\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand version" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l kubeconfig -d 'Path to the kubeconfig file to use' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l context -d 'The name of the kubeconfig context to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l cluster -d 'The name of the kubeconfig cluster to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l user -d 'The name of the kubeconfig user to use' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -s n -l namespace -d 'The namespace scope for this request' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -s s -l server -d 'The address and port of the Kubernetes API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l token -d 'Bearer token for authentication to the API server' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l as -d 'Username to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l as-group -d 'Group to impersonate for the operation (repeatable)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l as-uid -d 'UID to impersonate for the operation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l certificate-authority -d 'Path to a cert file for the certificate authority' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l client-certificate -d 'Path to a client certificate file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l client-key -d 'Path to a client key file for TLS' -r -F
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l tls-server-name -d 'Server name to use for server certificate validation' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l request-timeout -d 'The length of time to wait before giving up on a single server request (e.g. 30s)' -r
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l color -d 'Colour output: auto (TTY, no NO_COLOR, TERM not dumb), always or never' -r -f -a "auto\t''
always\t''
never\t''"
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -l insecure-skip-tls-verify -d 'If true, the server\'s certificate will not be checked for validity'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand completion" -s h -l help -d 'Print help'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "status" -d 'Show CocoonSets (all in the namespace, or the named ones with their members)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "describe" -d 'Show a CocoonSet, a pod or a CocoonHibernation with its conditions and Events'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "wait" -d 'Wait (read-only) until targets reach a phase, e.g. cocoonset/NAME --for=Suspended'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "suspend" -d 'Suspend CocoonSets: hibernate every VM to the registry (spec.suspend=true)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "resume" -d 'Resume suspended CocoonSets (spec.suspend=false)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "hibernate" -d 'Hibernate pods through their CocoonHibernation (created if missing, named after the pod)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "wake" -d 'Wake hibernated pods (CocoonHibernation desire=Wake); `wake cocoonset/NAME` resumes a set'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "checkpoint" -d 'Save a running pod\'s (or a set\'s main agent\'s) VM to the registry as a CocoonCheckpoint'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "fork" -d 'Start COUNT independent CocoonSets (PREFIX-1 … PREFIX-COUNT) from a checkpoint'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "migrate" -d 'Move a set\'s main agent to NODE (spec.nodeName); --cancel restores the previous pin'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "pin" -d 'Pin a set\'s main agent to NODE (same as migrate --to NODE)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "unpin" -d 'Remove a set\'s pin (spec.nodeName)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "logs" -d 'Show a member\'s guest log through the API server (pods/log)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "report" -d 'Write a support bundle (tar.gz) of one CocoonSet, secrets redacted'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "registry" -d 'Registry maintenance'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "version" -d 'Print the plugin and operator versions'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "completion" -d 'Print a static completion script for bash, zsh, fish or powershell'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and not __fish_seen_subcommand_from status describe wait suspend resume hibernate wake checkpoint fork migrate pin unpin logs report registry version completion help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c kubectl-cocoon -n "__fish_kubectl_cocoon_using_subcommand help; and __fish_seen_subcommand_from registry" -f -a "gc" -d 'Delete :hibernate tags (and :latest with --include-latest) of VM repositories, and :checkpoint tags of checkpoint repositories, that no live CocoonSet, CocoonHibernation, CocoonCheckpoint or pod references. Dry run unless --yes'
