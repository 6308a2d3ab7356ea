//! The row layout on its own: pure integer logic, no MLX.
use latent_cache::core::layout::row_layout::{LayoutKind, Rollback, RowLayout};
use latent_cache::ErrorKind;

fn layout(rows: &[usize]) -> RowLayout {
    RowLayout::from_row_offsets(rows)
}

#[test]
fn rows_are_right_justified_to_the_longest() {
    let l = layout(&[3, 7, 5]);
    assert_eq!(l.offset(), 7);
    assert_eq!(l.left_pad(), &[4, 0, 2]);
    assert_eq!(l.row_offsets(), vec![3, 7, 5]);
    assert_eq!(l.shortest_row(), 3);
}

#[test]
fn append_checks_batch_counts_and_limits() {
    let mut l = RowLayout::default();
    assert_eq!(l.batch_size(), 0);
    assert_eq!(l.check_append(0, 1, 0).unwrap_err().kind, ErrorKind::Shape);
    assert_eq!(l.check_append(1, 0, 0).unwrap_err().kind, ErrorKind::Shape);
    l.check_append(2, 3, 4).unwrap();
    l.append(2, 3);
    assert_eq!(l.check_append(3, 1, 0).unwrap_err().kind, ErrorKind::Shape);
    assert_eq!(l.check_append(2, 2, 4).unwrap_err().kind, ErrorKind::Capacity);
    assert_eq!(l.max_append_tokens(4), 1);
    assert_eq!(l.max_append_tokens(0), usize::MAX);
    assert_eq!(l.check_append(2, usize::MAX, 0).unwrap_err().kind, ErrorKind::Shape);
}

#[test]
fn trim_is_bounded_by_the_shortest_row_and_guarded_in_rounds() {
    let mut l = layout(&[2, 5]);
    assert_eq!(l.check_trim(3, false).unwrap_err().kind, ErrorKind::OutOfRange);
    l.check_trim(2, false).unwrap();
    l.begin_round().unwrap();
    assert_eq!(l.check_trim(1, false).unwrap_err().kind, ErrorKind::State);
    // A bypass trim may drop only positions appended in the round: a rollback must still be
    // able to restore what every row held before it.
    assert_eq!(l.check_trim(1, true).unwrap_err().kind, ErrorKind::State);
    l.append(2, 2);
    l.check_trim(2, true).unwrap();
    assert_eq!(l.check_trim(3, true).unwrap_err().kind, ErrorKind::State);
    l.trim(1);
    assert_eq!(l.row_offsets(), vec![3, 6]);
    assert_eq!(l.plan_rollback(&[0, 0]).unwrap(), Rollback::Trim(1));
}

#[test]
fn ragged_rows_end_where_they_end() {
    let mut l = RowLayout::new(LayoutKind::Ragged);
    l.check_append_padded(3, 5, &[2, 0, 4], 0).unwrap();
    l.append_padded(5, &[2, 0, 4]);
    assert_eq!((l.offset(), l.left_pad(), l.row_ends()), (5, &[2, 0, 4][..], &[5, 5, 5][..]));
    assert_eq!(l.row_offsets(), vec![3, 5, 1]);
    l.begin_round().unwrap();
    assert_eq!(l.append_starts(3), vec![5, 5, 5]);
    l.append(3, 4);
    // Rows keep 1, 4 and 0 of the 4 appended: only the ends move.
    let Rollback::Ends(after) = l.plan_rollback(&[1, 4, 0]).unwrap() else { panic!("expected ends") };
    assert_eq!(after.row_ends(), &[6, 9, 5]);
    assert_eq!(after.left_pad(), &[2, 0, 4]);
    assert_eq!(after.offset(), 9);
    assert_eq!(after.row_offsets(), vec![4, 9, 1]);
    assert!(!after.in_round());
    l.adopt(after);
    // The next append writes each row at its own end.
    assert_eq!(l.append_starts(3), vec![6, 9, 5]);
    l.append(3, 2);
    assert_eq!(l.row_ends(), &[8, 11, 7]);
    assert_eq!(l.offset(), 11);
    l.trim(3);
    assert_eq!(l.row_ends(), &[5, 8, 4]);
    // A filter places kept rows at position 0: new position j reads old j + left_pad.
    let plan = l.plan_filter(&[2, 0]).unwrap();
    assert_eq!(plan.shift, vec![4, 2]);
    assert_eq!(plan.layout.left_pad(), &[0, 0]);
    assert_eq!(plan.layout.row_ends(), &[0, 3]);
    l.reset();
    assert_eq!(l.kind(), LayoutKind::Ragged, "reset keeps the layout kind");
}

#[test]
fn a_padded_first_append_is_checked() {
    let mut l = RowLayout::new(LayoutKind::RightJustified);
    assert_eq!(l.check_append_padded(2, 3, &[1], 0).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(l.check_append_padded(2, 3, &[4, 0], 0).unwrap_err().kind, ErrorKind::OutOfRange);
    assert_eq!(l.check_append_padded(2, 3, &[1, 2], 0).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(l.check_append_padded(2, 3, &[1, 0], 2).unwrap_err().kind, ErrorKind::Capacity);
    l.check_append_padded(2, 3, &[3, 0], 0).unwrap();
    l.append_padded(3, &[3, 0]);
    assert_eq!((l.row_offsets(), l.row_ends()), (vec![0, 3], &[3, 3][..]));
    assert_eq!(l.check_append_padded(2, 3, &[0, 0], 0).unwrap_err().kind, ErrorKind::State);
}

#[test]
fn equal_drops_roll_back_as_a_trim() {
    let mut l = layout(&[4, 6]);
    l.begin_round().unwrap();
    l.append(2, 3);
    assert_eq!(l.plan_rollback(&[1, 1]).unwrap(), Rollback::Trim(2));
}

#[test]
fn unequal_drops_shift_rows_and_remove_common_padding() {
    // Row 0 holds 4 + 3 appended, row 1 holds 6 + 3; row 0 keeps 3, row 1 keeps 0.
    let mut l = layout(&[4, 6]);
    l.begin_round().unwrap();
    l.append(2, 3);
    let Rollback::Relayout(plan) = l.plan_rollback(&[3, 0]).unwrap() else { panic!("expected a relayout") };
    assert_eq!(plan.layout.row_offsets(), vec![7, 6]);
    assert_eq!(plan.layout.offset(), 7);
    assert_eq!(plan.layout.left_pad(), &[0, 1]);
    // Old width 9: row 0's last kept position was 8 and stays 6 (new width 7 - 1): shift 2.
    // Row 1's last kept position was 5 and becomes 6: shift -1.
    assert_eq!(plan.shift, vec![2, -1]);
    assert_eq!(plan.rows, vec![0, 1]);
}

#[test]
fn rollback_misuse_is_refused() {
    let mut l = layout(&[2, 2]);
    assert_eq!(l.plan_rollback(&[0, 0]).unwrap_err().kind, ErrorKind::State);
    l.begin_round().unwrap();
    assert_eq!(l.begin_round().unwrap_err().kind, ErrorKind::State);
    l.append(2, 2);
    assert_eq!(l.plan_rollback(&[3, 0]).unwrap_err().kind, ErrorKind::OutOfRange);
    assert_eq!(l.plan_rollback(&[1]).unwrap_err().kind, ErrorKind::InvalidArgument);
    l.commit_round().unwrap();
    assert_eq!(l.commit_round().unwrap_err().kind, ErrorKind::State);
}

#[test]
fn a_bypass_trim_never_cuts_below_the_round_start() {
    let mut l = layout(&[5]);
    l.begin_round().unwrap();
    l.append(1, 2);
    // Cutting into the 5 positions held before the round would make rollback(keep) unable to
    // restore them: refused, nothing changed.
    assert_eq!(l.check_trim(4, true).unwrap_err().kind, ErrorKind::State);
    assert_eq!(l.row_offsets(), vec![7]);
    l.check_trim(1, true).unwrap();
    l.trim(1);
    assert_eq!(l.plan_rollback(&[2]).unwrap_err().kind, ErrorKind::OutOfRange);
    assert_eq!(l.plan_rollback(&[1]).unwrap(), Rollback::Trim(0));
}

#[test]
fn filter_keeps_listed_rows_in_order_and_drops_unneeded_padding() {
    let l = layout(&[2, 9, 4]);
    let plan = l.plan_filter(&[2, 0]).unwrap();
    assert_eq!(plan.layout.row_offsets(), vec![4, 2]);
    assert_eq!(plan.layout.offset(), 4);
    assert_eq!(plan.shift, vec![5, 5]);
    assert_eq!(l.plan_filter(&[1, 1]).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(l.plan_filter(&[3]).unwrap_err().kind, ErrorKind::OutOfRange);
    assert_eq!(l.plan_filter(&[]).unwrap_err().kind, ErrorKind::InvalidArgument);
}
