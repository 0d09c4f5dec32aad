//! `redbaton`: an operator's look at the locks, semaphores and latches of a
//! redbaton deployment, and a way to free a lock whose holder is stuck.
//!
//! Everything goes through the library's public API (`Client::held_names`,
//! `Lock::holder`, `Client::rw_lock_holders`, `Lock::force_unlock`, ...):
//! the key layout lives in the library only. Exit codes: 0 done, 1 failed (Redis, or a force-unlock not
//! confirmed), 2 usage.

use std::io::{self, BufRead, Write};
use std::process::ExitCode;
use std::time::Duration;

use redbaton::{Client, Holder, SyncKind, Topology};

const USAGE: &str = "\
usage: redbaton [DEPLOYMENT] [--prefix PREFIX] COMMAND

deployment (one of; default: the REDBATON_URL environment variable):
  --url URL                   one server (redis://, rediss://, redis+unix://)
  --cluster URL[,URL...]      a Redis Cluster, through these seeds
  --sentinel SERVICE URL[,URL...]
                              the master of SERVICE as these sentinels name it
  --masters URL,URL,URL...    the independent masters of a Redlock quorum
  --prefix PREFIX             the clients' key prefix (default: redbaton)

commands:
  list [PATTERN]              what is held, of every kind, whose name matches
                              the glob PATTERN (default *): one row per
                              holder: kind (lock, fair_lock, write, read,
                              permits, latch), name, client, holds (depth,
                              permits or count), token, lease, owner
  show NAME                   the holder of lock NAME
  fair NAME                   the holder and queued waiters of fair lock NAME
  semaphore NAME              total and available permits of semaphore NAME
  latch NAME                  the count of latch NAME
  force-unlock NAME [--fair] [--yes]
                              remove lock NAME (fair lock with --fair)
                              whoever holds it; asks to type the name unless
                              --yes
  help, --help, -h            this text

exit codes: 0 done, 1 failed or not confirmed, 2 usage
";

/// Where the clients' data is.
#[derive(Debug, PartialEq)]
struct Target {
    topology: Deployment,
    prefix: Option<String>,
}

#[derive(Debug, PartialEq)]
enum Deployment {
    Url(String),
    Cluster(Vec<String>),
    Sentinel(String, Vec<String>),
    Masters(Vec<String>),
}

#[derive(Debug, PartialEq)]
enum Command {
    List(String),
    Show(String),
    Fair(String),
    Semaphore(String),
    Latch(String),
    ForceUnlock { name: String, fair: bool, yes: bool },
}

/// A usage error: its message, printed before a pointer to `--help`.
#[derive(Debug, PartialEq)]
struct Usage(String);

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (target, command) = match parse(&args, std::env::var("REDBATON_URL").ok()) {
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Ok(Some(parsed)) => parsed,
        Err(Usage(message)) => {
            eprintln!("redbaton: {message}\n(redbaton --help for usage)");
            return ExitCode::from(2);
        }
    };
    match run(target, command) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("redbaton: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Reads the arguments: options first, then a command and its operands.
/// `env_url` stands in for a missing deployment option. `None`: help was
/// asked for.
fn parse(args: &[String], env_url: Option<String>) -> Result<Option<(Target, Command)>, Usage> {
    let mut topology = None;
    let mut prefix = None;
    let mut rest = args.iter().map(String::as_str);
    let set = |current: &mut Option<Deployment>, new| {
        if current.replace(new).is_some() {
            return Err(Usage("give one deployment option only".to_owned()));
        }
        Ok(())
    };
    let command = loop {
        let Some(arg) = rest.next() else {
            return Err(Usage("no command given".to_owned()));
        };
        let mut value = |option: &str| {
            rest.next()
                .map(str::to_owned)
                .ok_or_else(|| Usage(format!("{option} needs a value")))
        };
        match arg {
            "--help" | "-h" | "help" => return Ok(None),
            "--url" => set(&mut topology, Deployment::Url(value(arg)?))?,
            "--cluster" => set(&mut topology, Deployment::Cluster(list(&value(arg)?)))?,
            "--masters" => set(&mut topology, Deployment::Masters(list(&value(arg)?)))?,
            "--sentinel" => {
                let service = value(arg)?;
                let sentinels = list(&value(arg)?);
                set(&mut topology, Deployment::Sentinel(service, sentinels))?;
            }
            "--prefix" => prefix = Some(value(arg)?),
            option if option.starts_with('-') => {
                return Err(Usage(format!("unknown option {option:?}")))
            }
            command => break command,
        }
    };
    let mut operands = Vec::new();
    let (mut fair, mut yes) = (false, false);
    for arg in rest {
        match arg {
            "--help" | "-h" => return Ok(None),
            "--yes" if command == "force-unlock" => yes = true,
            "--fair" if command == "force-unlock" => fair = true,
            option if option.starts_with('-') => {
                return Err(Usage(format!("unknown option {option:?} for {command}")))
            }
            operand => operands.push(operand.to_owned()),
        }
    }
    let one_name = |operands: Vec<String>| match <[String; 1]>::try_from(operands) {
        Ok([name]) => Ok(name),
        Err(_) => Err(Usage(format!("{command} takes exactly one NAME"))),
    };
    let command = match command {
        "list" => match operands.len() {
            0 => Command::List("*".to_owned()),
            1 => Command::List(operands.remove(0)),
            _ => return Err(Usage("list takes at most one PATTERN".to_owned())),
        },
        "show" => Command::Show(one_name(operands)?),
        "fair" => Command::Fair(one_name(operands)?),
        "semaphore" => Command::Semaphore(one_name(operands)?),
        "latch" => Command::Latch(one_name(operands)?),
        "force-unlock" => Command::ForceUnlock {
            name: one_name(operands)?,
            fair,
            yes,
        },
        other => return Err(Usage(format!("unknown command {other:?}"))),
    };
    let topology = match (topology, env_url) {
        (Some(topology), _) => topology,
        (None, Some(url)) if !url.is_empty() => Deployment::Url(url),
        (None, _) => return Err(Usage(
            "no deployment: give --url, --cluster, --sentinel or --masters, or set REDBATON_URL"
                .to_owned(),
        )),
    };
    Ok(Some((Target { topology, prefix }, command)))
}

/// `a,b,c` as its non-empty parts.
fn list(value: &str) -> Vec<String> {
    value
        .split(',')
        .filter(|part| !part.is_empty())
        .map(str::to_owned)
        .collect()
}

fn run(target: Target, command: Command) -> Result<ExitCode, redbaton::Error> {
    let topology = match target.topology {
        Deployment::Url(url) => Topology::server(&url),
        Deployment::Cluster(seeds) => Topology::cluster(seeds),
        Deployment::Sentinel(service, sentinels) => Topology::sentinel(&service, sentinels),
        Deployment::Masters(urls) => Topology::masters(urls),
    };
    let mut builder =
        Client::builder(topology).client_name(&format!("redbaton-cli:{}", std::process::id()));
    if let Some(prefix) = &target.prefix {
        builder = builder.prefix(prefix);
    }
    let client = builder.build()?;
    match command {
        Command::List(pattern) => list_held(&client, &pattern)?,
        Command::Show(name) => describe(&name, client.lock(&name)?.holder()?),
        Command::Fair(name) => {
            let lock = client.fair_lock(&name)?;
            describe(&name, lock.holder()?);
            println!("waiters: {}", lock.queued_waiters()?);
        }
        Command::Semaphore(name) => {
            let semaphore = client.semaphore(&name)?;
            println!("semaphore: {}", shown(&name));
            println!("total permits: {}", semaphore.total_permits()?);
            println!("available permits: {}", semaphore.available_permits()?);
        }
        Command::Latch(name) => {
            let latch = client.count_down_latch(&name)?;
            println!("latch: {}", shown(&name));
            println!("count: {}", latch.count()?);
        }
        Command::ForceUnlock { name, fair, yes } => {
            let lock = if fair {
                client.fair_lock(&name)?
            } else {
                client.lock(&name)?
            };
            let Some(holder) = lock.holder()? else {
                println!("{} is not held: nothing to unlock", shown(&name));
                return Ok(ExitCode::SUCCESS);
            };
            describe(&name, Some(holder));
            if !yes && !confirmed(&name) {
                eprintln!("redbaton: not confirmed: {} left as it is", shown(&name));
                return Ok(ExitCode::FAILURE);
            }
            if lock.force_unlock()? {
                println!("{} unlocked", shown(&name));
            } else {
                println!("{} was freed meanwhile: nothing to unlock", shown(&name));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints what holds something now, of every kind, one row per holder
/// (a read-write lock's readers and a semaphore's permits each a row). A
/// name freed between the listing and its look is left out.
fn list_held(client: &Client, pattern: &str) -> Result<(), redbaton::Error> {
    println!("KIND\tNAME\tCLIENT\tHOLDS\tTOKEN\tLEASE\tOWNER");
    let row = |kind: &str, name: &str, holder: &Holder| {
        println!(
            "{kind}\t{}\t{}\t{}\t{}\t{}\t{}",
            shown(name),
            client_of(holder.client_name.as_deref()),
            holder.depth,
            holder.fencing_token,
            lease(holder.remaining_lease),
            holder.owner
        );
    };
    for (kind, name) in client.held_names(pattern)? {
        match kind {
            SyncKind::Lock | SyncKind::FairLock => {
                let (label, lock) = if kind == SyncKind::Lock {
                    ("lock", client.lock(&name)?)
                } else {
                    ("fair_lock", client.fair_lock(&name)?)
                };
                if let Some(holder) = lock.holder()? {
                    row(label, &name, &holder);
                }
            }
            SyncKind::RwLock => {
                let holders = client.rw_lock_holders(&name)?;
                if let Some(writer) = &holders.writer {
                    row("write", &name, writer);
                }
                for reader in &holders.readers {
                    row("read", &name, reader);
                }
            }
            SyncKind::Semaphore => {
                for permit in client.semaphore_holders(&name)? {
                    println!(
                        "permits\t{}\t{}\t{}\t-\t{}\t{}",
                        shown(&name),
                        client_of(permit.client_name.as_deref()),
                        permit.permits,
                        lease(permit.remaining_lease),
                        permit.owner
                    );
                }
            }
            SyncKind::Latch => {
                let count = client.count_down_latch(&name)?.count()?;
                if count > 0 {
                    println!("latch\t{}\t-\t{count}\t-\t-\t-", shown(&name));
                }
            }
            // A kind this binary does not know yet: named, not described.
            _ => println!("{kind:?}\t{}\t-\t-\t-\t-\t-", shown(&name)),
        }
    }
    Ok(())
}

/// Asks the operator to type `name`; whether they did (end of input: no).
fn confirmed(name: &str) -> bool {
    print!(
        "This removes the lock whoever holds it; its holder may still be working.\n\
         Type the name to confirm: "
    );
    let _ = io::stdout().flush();
    let mut line = String::new();
    match io::stdin().lock().read_line(&mut line) {
        Ok(0) | Err(_) => false,
        Ok(_) => line.trim_end_matches(['\n', '\r']) == name,
    }
}

fn describe(name: &str, holder: Option<Holder>) {
    println!("lock: {}", shown(name));
    let Some(holder) = holder else {
        println!("held: no");
        return;
    };
    println!("held: yes");
    println!("client: {}", client_of(holder.client_name.as_deref()));
    println!("owner: {}", holder.owner);
    println!("depth: {}", holder.depth);
    println!("token: {}", holder.fencing_token);
    println!("lease left: {}", lease(holder.remaining_lease));
}

fn client_of(name: Option<&str>) -> &str {
    name.unwrap_or("-")
}

fn lease(left: Option<Duration>) -> String {
    match left {
        Some(left) => format!("{:.3}s", left.as_secs_f64()),
        None => "none".to_owned(),
    }
}

/// A name as printed: as is, unless it holds control characters (a tab or
/// a newline would break the listing's columns), then quoted and escaped.
fn shown(name: &str) -> String {
    if name.chars().any(char::is_control) {
        format!("{name:?}")
    } else {
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn commands_and_deployments_are_read() {
        let (target, command) = parse(&args("--url redis://h list jobs:*"), None)
            .unwrap()
            .unwrap();
        assert_eq!(command, Command::List("jobs:*".to_owned()));
        assert_eq!(target.topology, Deployment::Url("redis://h".to_owned()));
        let (target, command) = parse(
            &args("--sentinel s redis://a,redis://b --prefix p force-unlock n --yes"),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            command,
            Command::ForceUnlock {
                name: "n".to_owned(),
                fair: false,
                yes: true
            }
        );
        assert_eq!(target.prefix.as_deref(), Some("p"));
        assert_eq!(
            target.topology,
            Deployment::Sentinel(
                "s".to_owned(),
                vec!["redis://a".to_owned(), "redis://b".to_owned()]
            )
        );
        let (target, _) = parse(&args("list"), Some("redis://env".to_owned()))
            .unwrap()
            .unwrap();
        assert_eq!(parse(&args("--url u show --help"), None), Ok(None));
        assert_eq!(target.topology, Deployment::Url("redis://env".to_owned()));
    }

    #[test]
    fn usage_errors_are_refused() {
        for line in [
            "",
            "--url",
            "--url u",
            "--url u show",
            "--url u show a b",
            "--url u list a b",
            "--url u frobnicate",
            "--url u --cluster v list",
            "--url u list --yes",
            "--bogus list",
            "list",
        ] {
            assert!(parse(&args(line), None).is_err(), "{line:?}");
        }
    }
}
