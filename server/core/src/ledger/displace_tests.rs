//! Unit tests of `displace.rs`.

use super::*;

fn pod(cpu_milli: u64, ports: &[u16]) -> PodSummary {
    let mut requests = Resources::default();
    requests.set(&ResourceName::Cpu, cpu_milli);
    PodSummary {
        requests,
        host_ports: ports
            .iter()
            .map(|p| crate::model::pod::HostPort {
                port: *p,
                protocol: crate::model::pod::Protocol::Tcp,
            })
            .collect(),
        ..PodSummary::default()
    }
}

fn total_cpu(room: &[(MemberKey, PodSummary)]) -> u64 {
    room.iter()
        .map(|(_, p)| p.requests.get(&ResourceName::Cpu))
        .sum()
}

#[test]
fn the_room_members_do_not_take_is_held_with_one_pod_per_victim_they_outnumber() {
    let victims = [pod(4000, &[80]), pod(4000, &[]), pod(4000, &[])];
    let members = [pod(5000, &[80])];
    let room = victim_room(
        TxnId(7),
        "n1",
        &victims.iter().collect::<Vec<_>>(),
        &members.iter().collect::<Vec<_>>(),
    );
    assert_eq!(room.len(), 2, "three victims, one member: two more pods");
    assert_eq!(total_cpu(&room), 7000);
    assert!(
        room.iter().all(|(_, p)| p.host_ports.is_empty()),
        "port 80 is the member's now"
    );
    assert!(room.iter().all(|(k, _)| is_placeholder(k)));
    assert_eq!(room[0].0.to_string(), "~victim-room/txn-7/n1~0");
}

#[test]
fn members_that_take_everything_leave_nothing_to_hold() {
    let victims = [pod(4000, &[])];
    let members = [pod(3000, &[]), pod(1000, &[])];
    let room = victim_room(
        TxnId(1),
        "n1",
        &victims.iter().collect::<Vec<_>>(),
        &members.iter().collect::<Vec<_>>(),
    );
    assert!(room.is_empty(), "{room:?}");
}

#[test]
fn a_victim_port_the_members_leave_is_held_even_when_nothing_else_is() {
    let victims = [pod(1000, &[9000])];
    let members = [pod(2000, &[])];
    let room = victim_room(
        TxnId(1),
        "n1",
        &victims.iter().collect::<Vec<_>>(),
        &members.iter().collect::<Vec<_>>(),
    );
    assert_eq!(room.len(), 1);
    assert_eq!(room[0].1.host_ports.len(), 1);
    assert_eq!(total_cpu(&room), 0);
}
