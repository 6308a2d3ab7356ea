//! Composed storage: joins and filters rebuild, and read what a fresh merge reads.
use super::*;

struct Composed {
    cache: LatentCache,
    r: Reference,
    rng: Rng,
}

impl Composed {
    fn new(g: Geometry, seed: u64) -> Composed {
        Composed { cache: LatentCache::new(g).unwrap(), r: Reference::new(g), rng: Rng::new(seed) }
    }

    fn append(&mut self, tokens: usize) {
        let batch = self.r.rows().max(1);
        let d = data(&mut self.rng, self.r.compact.widths, batch, tokens);
        self.cache.append_host(batch, tokens, &d[0], &d[1], Some(&d[2])).unwrap();
        self.r.both(|m| m.append(batch, tokens, &d));
        self.r.settle();
    }

    fn filter(&mut self, keep: &[usize]) {
        self.cache.filter_rows(keep).unwrap();
        self.r.both(|m| m.filter(keep));
        self.r.converted = keep.iter().map(|&b| self.r.converted[b]).collect();
        self.r.settle();
    }

    fn rollback(&mut self, keep: &[usize]) {
        self.cache.spec_round_rollback(keep).unwrap();
        self.r.both(|m| m.rollback(keep));
        self.r.settle();
    }
}

#[test]
fn composed_joins_and_leaves_read_what_a_fresh_merge_reads() {
    use StorageMode::*;
    for layout in LAYOUTS {
        for hw in [1, 64, 100] {
            let g = composed_layer(128, hw, F32, [Q8, Bf16, Fp8], layout);
            let what = format!("{layout:?} hot {hw}");
            let mut batch = Composed::new(g, hw as u64);
            batch.cache.reserve_rows(6).unwrap();
            batch.append(150);
            let mut reqs: Vec<Composed> = (0..3).map(|i| Composed::new(g, 100 + i)).collect();
            for (i, r) in reqs.iter_mut().enumerate() {
                r.append(10 + 90 * i);
            }
            // Join three requests of different boundaries (one empty source too).
            let empty = Composed::new(g, 9);
            batch.cache.merge_rows(&[&reqs[0].cache, &empty.cache, &reqs[1].cache, &reqs[2].cache]).unwrap();
            batch.r = Reference::merge(&[&batch.r, &reqs[0].r, &empty.r, &reqs[1].r, &reqs[2].r]);
            batch.r.check(&batch.cache, &format!("{what}: join"));
            // The same rows merged into a fresh cache read the same.
            let mut fresh = LatentCache::new(g).unwrap();
            let rows: Vec<LatentCache> = (0..batch.r.rows()).map(|b| batch.cache.extract_row(b).unwrap()).collect();
            fresh.merge_rows(&rows.iter().collect::<Vec<_>>()).unwrap();
            batch.r.check(&fresh, &format!("{what}: fresh merge of the joined rows"));
            // Mid prefill maintenance a join is refused and changes nothing.
            batch.cache.prefill_begin().unwrap();
            let before = snapshot(&batch.cache);
            assert_refused(
                batch.cache.merge_rows(&[&reqs[0].cache]),
                ErrorKind::State,
                &batch.cache,
                &before,
                "join mid-maintenance",
            );
            batch.cache.prefill_end().unwrap();
            batch.r.check(&batch.cache, &format!("{what}: after maintenance"));

            for keep in [vec![1, 2, 3, 4], vec![3, 1, 2], vec![0, 2], vec![1, 0]] {
                batch.filter(&keep);
                batch.r.check(&batch.cache, &format!("{what}: filter {keep:?}"));
                batch.append(70);
                batch.r.check(&batch.cache, &format!("{what}: append after filter {keep:?}"));
                let mut j = Composed::new(g, keep.len() as u64);
                j.append(130);
                batch.cache.merge_rows(&[&j.cache]).unwrap();
                batch.r = Reference::merge(&[&batch.r, &j.r]);
                batch.r.check(&batch.cache, &format!("{what}: join after filter {keep:?}"));
                // A round with an uneven rollback on the joined batch.
                batch.cache.spec_round_begin().unwrap();
                batch.r.both(|m| m.begin());
                batch.append(5);
                let keep: Vec<usize> = (0..batch.r.rows()).map(|b| b % 6).collect();
                batch.rollback(&keep);
                batch.r.check(&batch.cache, &format!("{what}: rollback {keep:?} after join"));
            }
        }
    }
}
