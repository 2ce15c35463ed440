//! Who is in the cluster: a static list, or every address a DNS name resolves to, resolved
//! again every `refresh`. A change rebuilds the ring (see `Shared::set_members`): links to new
//! members start, links to members gone are closed and what they held is routed again.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::Shared;
use crate::config::{Discovery, DnsDiscovery};

/// Learns the first membership (a DNS name that does not resolve yet leaves this node alone on
/// its ring, with a warning, until it does) and keeps it current.
pub(crate) async fn start(shared: &Arc<Shared>) -> Result<(), String> {
    match shared.config.discovery.clone() {
        Discovery::Static(members) => {
            shared.set_members(members);
            Ok(())
        }
        Discovery::Dns(dns) => {
            match resolve(&dns).await {
                Ok(members) => {
                    if !members.contains(&shared.config.node) {
                        tracing::warn!(name = %dns.name, node = %shared.config.node, resolved = %members.join(", "),
                            "this node's own address is not among those the discovery name resolves to; it takes part in the ring anyway");
                    }
                    shared.set_members(members);
                }
                Err(e) => {
                    tracing::warn!(name = %dns.name, error = %e, "cluster discovery: cannot resolve yet; retrying")
                }
            }
            let weak = Arc::downgrade(shared);
            let stop = shared.stop.clone();
            tokio::spawn(async move {
                let mut last_error = String::new();
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(dns.refresh.0) => {}
                        _ = stop.cancelled() => return,
                    }
                    let Some(shared) = weak.upgrade() else { return };
                    match resolve(&dns).await {
                        Ok(members) => {
                            last_error.clear();
                            shared.set_members(members);
                        }
                        Err(e) => {
                            // The last membership stands: a resolver hiccup does not empty the ring.
                            if e != last_error {
                                tracing::warn!(name = %dns.name, error = %e, "cluster discovery: resolving failed; keeping the last membership");
                            }
                            last_error = e;
                        }
                    }
                }
            });
            Ok(())
        }
    }
}

/// Every address the name resolves to, as `ip:port`, sorted.
async fn resolve(dns: &DnsDiscovery) -> Result<Vec<String>, String> {
    let addrs = tokio::net::lookup_host((dns.name.as_str(), dns.port))
        .await
        .map_err(|e| format!("resolving `{}`: {e}", dns.name))?;
    let set: BTreeSet<String> = addrs.map(|a| a.to_string()).collect();
    if set.is_empty() {
        return Err(format!("`{}` resolves to no address", dns.name));
    }
    Ok(set.into_iter().collect())
}
