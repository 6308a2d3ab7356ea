//! Two processes on this machine over MLX's own ring backend (TCP on 127.0.0.1), each this test
//! binary run again as one rank (`rank`, ignored unless a parent names it): a prefill handed from
//! rank 0 to rank 1 (`core::transfer`), restored bit for bit in every layer (float32, Q8 and the
//! MTP layer in bfloat16) and decoded on; then a handoff the receiver refuses (its set holds
//! rows), which fails on both sides with a status and leaves the set as it was. Bounded: the
//! parent kills the ranks after two minutes.
#[path = "common/mod.rs"]
mod common;
#[path = "store/engine.rs"]
#[allow(dead_code)]
mod engine;

use common::mlx_helpers::geometry_in;
use common::model::Rng;
use common::ranks::run_ranks;
use engine::{tokens, Engine};

use latent_cache::core::mlx::distributed::Group;
use latent_cache::core::transfer::{recv_row, send_row};
use latent_cache::{ErrorKind, Geometry, LayoutKind, Role, StorageMode};

const PREFILL: usize = 2048;

fn geometries() -> Vec<Geometry> {
    let f32s = [StorageMode::F32; 3];
    let mtp = Geometry { role: Role::Mtp, ..geometry_in([128, 64, 0], [StorageMode::Bf16; 3], LayoutKind::RightJustified) };
    vec![
        geometry_in([128, 64, 128], f32s, LayoutKind::RightJustified),
        geometry_in([128, 64, 0], [StorageMode::Q8, StorageMode::Bf16, StorageMode::Q8], LayoutKind::Ragged),
        mtp,
    ]
}

/// Run by the parent below only.
#[test]
#[ignore]
fn rank() {
    let Ok(rank) = std::env::var("MLX_RANK") else {
        return;
    };
    let group = Group::init("ring", true).unwrap();
    assert_eq!((group.rank(), group.size()), (rank.parse().unwrap(), 2));
    let gs = geometries();
    let prompt = tokens(&mut Rng::new(44), PREFILL);
    if group.rank() == 0 {
        let mut a = Engine::new(&gs);
        a.extend(&prompt);
        assert_eq!(send_row(&a.shared(), 0, &group, 1).unwrap(), PREFILL);
        let refused = send_row(&a.shared(), 0, &group, 1).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::State, "{}", refused.message);
        a.check("the sender's set after its handoffs");
    } else {
        let mut b = Engine::new(&gs);
        assert_eq!(recv_row(&mut b.refs(), &group, 0).unwrap(), PREFILL);
        b.tokens = prompt.clone();
        b.check("the received row");
        b.extend(&tokens(&mut Rng::new(45), 16));
        b.check("the received row, decoded on");
        let refused = recv_row(&mut b.refs(), &group, 0).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::InvalidArgument, "{}", refused.message);
        b.check("a set that refused a second row");
    }
}

#[test]
fn a_prefill_handed_to_another_process_decodes_on_bit_for_bit() {
    run_ranks("rank", |codes, _| {
        assert_eq!(codes, [Some(true), Some(true)], "both ranks finished their checks within two minutes");
    });
}
