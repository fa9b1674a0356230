//! Nodes (#26, first step): `weft serve --node NAME` holds a lease on the project's database
//! that `weft nodes` shows; the name is refused to a second holder while the lease runs, runs
//! out when its holder dies (kill -9: nothing renews it), and is then taken with the next
//! epoch. On both backends (the lease's clock is the database's).

use crate::support::{exits_within, spawn_announcing, weft_cmd, Fixture, BACKENDS};
use serde_json::Value;

fn serve_node(fx: &Fixture) -> std::process::Command {
    let mut cmd = weft_cmd(fx.root());
    cmd.args([
        "serve",
        "--addr",
        "127.0.0.1:0",
        "--node",
        "alpha",
        "--node-lease",
        "1",
    ]);
    cmd
}

fn nodes(fx: &Fixture) -> Vec<Value> {
    serde_json::from_value(crate::support::weft_json(fx.root(), &["nodes", "--json"])).unwrap()
}

/// Polls `weft nodes` until `alpha` satisfies `want` (at most 10 s).
fn alpha_when(fx: &Fixture, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    let start = std::time::Instant::now();
    loop {
        let all = nodes(fx);
        if let Some(a) = all.iter().find(|n| n["name"] == "alpha" && want(n)) {
            return a.clone();
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{what}: {all:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn a_node_holds_its_name_while_it_lives_and_loses_it_when_it_dies() {
    for backend in BACKENDS {
        let Some(fx) = Fixture::on(backend, &[], "", "") else {
            return;
        };
        let (mut first, line) = spawn_announcing(&mut serve_node(&fx));
        assert!(line.starts_with("weft serve: http://"), "{line}");
        let pid = i64::from(first.id());
        let held = alpha_when(&fx, "the lease is seen", |n| n["alive"] == true);
        assert_eq!(held["epoch"], 1, "{held}");
        assert_eq!(held["pid"], pid, "{held}");
        // Renewed: still alive after several lease lengths.
        std::thread::sleep(std::time::Duration::from_millis(2500));
        alpha_when(&fx, "the lease is renewed", |n| {
            n["alive"] == true && n["pid"] == pid
        });
        // A second holder of the name is refused while the lease runs.
        let second = serve_node(&fx)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let refused = exits_within(second, 30, "a second node of the same name");
        let said = String::from_utf8_lossy(&refused.stderr);
        assert!(
            !refused.status.success() && said.contains("alpha") && said.contains(&pid.to_string()),
            "{backend:?}: {said}"
        );
        // Killed: nothing renews the lease; it runs out.
        first.kill().unwrap();
        first.wait().unwrap();
        alpha_when(&fx, "the dead node's lease runs out", |n| {
            n["alive"] == false
        });
        // The name is taken with the next epoch.
        let (mut third, _) = spawn_announcing(&mut serve_node(&fx));
        let taken = alpha_when(&fx, "the name is taken over", |n| {
            n["alive"] == true && n["epoch"] == 2
        });
        assert_eq!(taken["pid"], i64::from(third.id()), "{taken}");
        // A clean stop gives the name up at once.
        std::process::Command::new("kill")
            .args(["-TERM", &third.id().to_string()])
            .status()
            .unwrap();
        assert!(third.wait().unwrap().success());
        let gone = nodes(&fx);
        assert_eq!(gone[0]["alive"], false, "{gone:?}");
    }
}

/// A name or a lease weft cannot hold is refused before anything starts, saying what it takes.
#[test]
fn a_bad_node_name_or_lease_is_refused() {
    let fx = Fixture::new(&[], "", "");
    for (args, says) in [
        (["--node", "", "--node-lease", "5"], "name"),
        (["--node", "a b", "--node-lease", "5"], "name"),
        (["--node", "alpha", "--node-lease", "1000"], "--node-lease"),
        (["--node", "alpha", "--node-lease", "0.1"], "--node-lease"),
    ] {
        let out = weft_cmd(fx.root())
            .args(["serve", "--addr", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && said.contains(says),
            "{args:?}: {said}"
        );
    }
    assert!(nodes(&fx).is_empty(), "nothing joined");
}

/// A node that comes back after its lease ran out (here: stopped with SIGSTOP past it, while
/// another took the name) finds its epoch gone at its next renewal and stops; the new holder
/// keeps the name.
#[test]
fn a_node_whose_lease_was_taken_over_stops_when_it_comes_back() {
    let Some(fx) = Fixture::on(crate::support::Backend::Postgres, &[], "", "") else {
        return;
    };
    let (first, _) = spawn_announcing(serve_node(&fx).stderr(std::process::Stdio::piped()));
    let pid = first.id().to_string();
    alpha_when(&fx, "the first lease", |n| n["alive"] == true);
    let signal = |sig: &str| {
        std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
    };
    signal("-STOP");
    alpha_when(&fx, "the stopped node's lease runs out", |n| {
        n["alive"] == false
    });
    let (mut second, _) = spawn_announcing(&mut serve_node(&fx));
    alpha_when(&fx, "the name taken over", |n| n["epoch"] == 2);
    signal("-CONT");
    let out = exits_within(first, 20, "the fenced node");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(1) && said.contains("lease"),
        "{:?} {said}",
        out.status
    );
    let kept = alpha_when(&fx, "the new holder keeps the name", |n| n["alive"] == true);
    assert_eq!(kept["epoch"], 2, "{kept}");
    assert_eq!(kept["pid"], i64::from(second.id()), "{kept}");
    second.kill().unwrap();
    second.wait().unwrap();
}

/// `node:` in the config names the node `weft serve` joins as (no flag needed), with its lease
/// and capacity; a lease weft cannot hold there is refused naming the key.
#[test]
fn the_config_names_the_node() {
    let fx = Fixture::new(
        &[],
        "",
        "node: { name: beta, lease: 1s, max_live_threads: 7 }\n",
    );
    let (mut server, line) =
        spawn_announcing(weft_cmd(fx.root()).args(["serve", "--addr", "127.0.0.1:0"]));
    assert!(line.starts_with("weft serve: http://"), "{line}");
    let start = std::time::Instant::now();
    let beta = loop {
        let all = nodes(&fx);
        if let Some(b) = all
            .iter()
            .find(|n| n["name"] == "beta" && n["alive"] == true)
        {
            break b.clone();
        }
        assert!(start.elapsed().as_secs() < 10, "{all:?}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(beta["max_live_threads"], 7, "{beta}");
    assert_eq!(beta["pid"], i64::from(server.id()), "{beta}");
    server.kill().unwrap();
    server.wait().unwrap();
    let bad = Fixture::new(&[], "", "node: { name: beta, lease: 1h }\n");
    let out = weft_cmd(bad.root())
        .args(["serve", "--addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("node: lease"),
        "{said}"
    );
    // A capacity without a name: the name comes from `--node`, else a clear refusal.
    let unnamed = Fixture::new(&[], "", "node: { max_live_threads: 7 }\n");
    let out = weft_cmd(unnamed.root())
        .args(["serve", "--addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("no `name`") && said.contains("--node"),
        "{said}"
    );
}
