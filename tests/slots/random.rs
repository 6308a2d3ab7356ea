//! Long random sequences against the model.
use super::*;

struct Run {
    g: Geometry,
    rng: Rng,
    cache: LatentCache,
    model: Model,
    log: Vec<String>,
    seed: u64,
    /// Joins into the running cache, and those that kept its buffers (bytes_in_use unchanged:
    /// the in-place path, bar a rebuild to the very same size).
    joins: (usize, usize),
}

impl Run {
    fn new(g: Geometry, seed: u64) -> Run {
        Run {
            g,
            rng: Rng::new(seed),
            cache: LatentCache::new(g).unwrap(),
            model: model_of(&g),
            log: Vec::new(),
            seed,
            joins: (0, 0),
        }
    }

    fn what(&self) -> String {
        let tail = &self.log[self.log.len().saturating_sub(8)..];
        format!("seed {} {:?} step {}: ... {}", self.seed, self.g.layout, self.log.len(), tail.join(" ; "))
    }

    fn check(&self) {
        assert_matches(&self.cache, &self.model, &self.what());
    }

    fn rows(&self) -> usize {
        self.model.rows.len()
    }

    /// A source for a join (and its model as it leaves: without right padding mid-prefill).
    fn source(&mut self) -> (LatentCache, Model, Model, String) {
        let g = self.g;
        let kind = self.rng.range(0, 7);
        let (mut cache, mut model) = match kind {
            0 => request(g, &mut self.rng, 0, 0, false),
            1 => {
                let longest = if self.rng.range(0, 3) == 0 { 120 } else { 20 };
                request(g, &mut self.rng, 1, longest, false)
            }
            2 => {
                let rows = self.rng.range(2, 3);
                request(g, &mut self.rng, rows, 30, true)
            }
            3 | 4 => {
                // A source whose own rows moved: rows left it in place, maybe one joined.
                let rows = self.rng.range(3, 4);
                let (mut cache, mut model) = request(g, &mut self.rng, rows, 25, kind == 4);
                let (keep, _) = filter_shape(&mut self.rng, rows);
                cache.filter_rows(&keep).unwrap();
                model.filter(&keep);
                if self.rng.range(0, 1) == 0 {
                    let (j, jm) = request(g, &mut self.rng, 1, 30, false);
                    cache.merge_rows(&[&j]).unwrap();
                    model = Model::merge(&[&model, &jm]);
                }
                let batch = model.rows.len();
                append(&mut self.rng, &mut cache, &mut model, batch, 2);
                (cache, model)
            }
            5 => (LatentCache::new(g).unwrap(), model_of(&g)),
            _ => {
                // A source mid-round (its speculative positions join too), or one whose rows
                // were trimmed to nothing.
                let rows = self.rng.range(1, 3);
                let (mut cache, mut model) = request(g, &mut self.rng, rows, 8, true);
                if self.rng.range(0, 1) == 0 {
                    cache.spec_round_begin().unwrap();
                    append(&mut self.rng, &mut cache, &mut model, rows, 2);
                } else {
                    let n = model.row_offsets().into_iter().min().unwrap();
                    cache.trim(n, false).unwrap();
                    model.trim(n);
                }
                (cache, model)
            }
        };
        let mut leaving = model.clone();
        leaving.round = None;
        let mut label = format!("source kind {kind} rows {:?}", model.row_offsets());
        if kind == 5 {
            // A source mid-prefill: its rows leave with their prompts, without right padding.
            let rows = self.rng.range(1, 3);
            let tokens = self.rng.range(2, 12);
            let right: Vec<usize> = (0..rows).map(|_| self.rng.range(0, tokens - 1)).collect();
            cache.prefill_prepare(None, None, Some(&right)).unwrap();
            append(&mut self.rng, &mut cache, &mut model, rows, tokens);
            model.prefill = Some(Prefill { lengths: None, left: None, right: Some(right.clone()), base: vec![0; rows] });
            leaving = model.prompts_only();
            label = format!("source mid-prefill {rows}x{tokens} right {right:?}");
        }
        (cache, model, leaving, label)
    }

    fn join(&mut self) {
        let count = self.rng.range(1, 3);
        let mut sources = Vec::new();
        for _ in 0..count {
            sources.push(self.source());
        }
        let added: usize = sources.iter().map(|s| s.2.rows.len().max(1)).sum();
        if self.rows() + added > 12 {
            return;
        }
        let refs: Vec<&LatentCache> = sources.iter().map(|s| &s.0).collect();
        let labels: Vec<&str> = sources.iter().map(|s| s.3.as_str()).collect();
        let slots_before = self.cache.bytes_in_use();
        if self.rng.range(0, 4) == 0 {
            // Through the set (one layer), or into a new cache.
            if self.rng.range(0, 1) == 0 {
                merge_all(&mut [&mut self.cache], &refs.iter().map(|r| vec![*r]).collect::<Vec<_>>()).unwrap();
            } else {
                let mut merged = LatentCache::new(self.g).unwrap();
                let mut all = vec![&self.cache];
                all.extend(refs.iter().copied());
                merged.merge_rows(&all).unwrap();
                self.cache = merged;
            }
        } else {
            self.cache.merge_rows(&refs).unwrap();
            self.joins.0 += 1;
            self.joins.1 += usize::from(self.cache.bytes_in_use() == slots_before);
        }
        let mut models = vec![&self.model];
        models.extend(sources.iter().map(|s| &s.2));
        self.model = Model::merge(&models);
        self.log.push(format!("join {labels:?} (bytes before {slots_before}, after {})", self.cache.bytes_in_use()));
        for (cache, model, _, label) in &sources {
            assert_matches(cache, model, &format!("{label} unchanged by the join, {}", self.what()));
        }
    }

    fn filter(&mut self) {
        let n = self.rows();
        let (keep, shape) = filter_shape(&mut self.rng, n);
        let before = self.cache.bytes_in_use();
        self.cache.filter_rows(&keep).unwrap();
        self.model.filter(&keep);
        self.log.push(format!("filter {keep:?} ({shape})"));
        assert!(self.cache.bytes_in_use() <= before, "a filter allocated more: {}", self.what());
    }

    fn append(&mut self) {
        let batch = self.rows();
        let tokens = match self.rng.range(0, 9) {
            0 => self.rng.range(100, 300),
            1..=3 => self.rng.range(5, 30),
            _ => self.rng.range(1, 3),
        };
        append(&mut self.rng, &mut self.cache, &mut self.model, batch, tokens);
        self.log.push(format!("append {batch}x{tokens}"));
    }

    fn trim(&mut self) {
        let shortest = match self.model.round {
            Some(_) => (0..self.rows()).map(|r| self.model.appended_in_round(r)).min().unwrap_or(0),
            None => self.model.row_offsets().into_iter().min().unwrap_or(0),
        };
        let n = self.rng.range(0, shortest.min(40));
        self.cache.trim(n, self.model.round.is_some()).unwrap();
        self.model.trim(n);
        self.log.push(format!("trim {n}"));
    }

    /// A round: a few appends, maybe a refused join and filter, then an uneven rollback or a commit.
    fn round(&mut self) {
        self.cache.spec_round_begin().unwrap();
        self.model.begin();
        self.log.push("begin".into());
        for _ in 0..self.rng.range(1, 3) {
            let batch = self.rows();
            let tokens = self.rng.range(1, 6);
            append(&mut self.rng, &mut self.cache, &mut self.model, batch, tokens);
            self.log.push(format!("append {batch}x{tokens} in round"));
        }
        if self.rng.range(0, 2) == 0 {
            let before = snapshot(&self.cache);
            let (j, _) = request(self.g, &mut self.rng, 1, 5, false);
            assert_refused(self.cache.merge_rows(&[&j]), ErrorKind::State, &self.cache, &before, "join mid-round");
            assert_refused(self.cache.filter_rows(&[0]), ErrorKind::State, &self.cache, &before, "filter mid-round");
            assert_refused(self.cache.extract_row(self.rows()), ErrorKind::OutOfRange, &self.cache, &before, "extract");
        }
        if self.rng.range(0, 3) == 0 {
            self.cache.spec_round_commit().unwrap();
            self.model.round = None;
            self.log.push("commit".into());
        } else {
            let keep: Vec<usize> = (0..self.rows()).map(|r| self.rng.range(0, self.model.appended_in_round(r))).collect();
            self.cache.spec_round_rollback(&keep).unwrap();
            self.model.rollback(&keep);
            self.log.push(format!("rollback {keep:?}"));
        }
    }

    /// A padded prefill of the running rows (right padding only): chunks, maybe a filter and a
    /// refused join mid-prefill, then finalize.
    fn prefill(&mut self) {
        let rows = self.rows();
        let tokens = self.rng.range(2, 10);
        let right: Vec<usize> = (0..rows).map(|_| self.rng.range(0, tokens - 1)).collect();
        let lengths: Option<Vec<usize>> = (self.rng.range(0, 1) == 0).then(|| right.iter().map(|r| tokens - r).collect());
        self.cache.prefill_prepare(lengths.as_deref(), None, Some(&right)).unwrap();
        let base = self.model.row_offsets();
        self.model.prefill = Some(Prefill { lengths: lengths.clone(), left: None, right: Some(right.clone()), base });
        append(&mut self.rng, &mut self.cache, &mut self.model, rows, tokens);
        self.log.push(format!("prefill {rows}x{tokens} right {right:?}"));
        self.check();
        let before = snapshot(&self.cache);
        let (j, _) = request(self.g, &mut self.rng, 1, 5, false);
        assert_refused(self.cache.merge_rows(&[&j]), ErrorKind::State, &self.cache, &before, "join mid-prefill");
        if rows > 1 && self.rng.range(0, 1) == 0 {
            self.filter();
            self.check();
        }
        // A row leaving mid-prefill leaves with its prompt.
        let row = self.rng.range(0, self.rows() - 1);
        let out = self.cache.extract_row(row).unwrap();
        assert_matches(&out, &self.model.prompts_only().extract(row), &format!("extract {row} mid-prefill, {}", self.what()));
        self.cache.prefill_finalize().unwrap();
        let right = self.model.prefill.take().unwrap().right.unwrap();
        for (row, &r) in right.iter().enumerate() {
            let len = self.model.len(row);
            self.model.truncate_row(row, len - r);
        }
        self.log.push("finalize".into());
    }

    fn step(&mut self) {
        match self.rng.range(0, 15) {
            0..=2 => self.join(),
            3..=4 => self.filter(),
            5..=7 => self.append(),
            8 => self.trim(),
            9..=10 => self.round(),
            11 => {
                let rows = self.rows() + self.rng.range(0, 4);
                if self.rng.range(0, 2) == 0 {
                    let before = self.cache.bytes_in_use();
                    self.cache.shrink_rows().unwrap();
                    self.log.push("shrink_rows".into());
                    assert!(self.cache.bytes_in_use() <= before, "shrink_rows allocated more: {}", self.what());
                } else {
                    self.cache.reserve_rows(rows).unwrap();
                    self.log.push(format!("reserve_rows {rows}"));
                }
                if self.rng.range(0, 5) == 0 {
                    // Reset, then a new batch (the slots are forgotten).
                    self.cache.reset();
                    self.model = model_of(&self.g);
                    let rows = self.rng.range(1, 4);
                    let reqs: Vec<(LatentCache, Model)> =
                        (0..rows).map(|_| request(self.g, &mut self.rng, 1, 20, false)).collect();
                    self.cache.merge_rows(&reqs.iter().map(|r| &r.0).collect::<Vec<_>>()).unwrap();
                    self.model = Model::merge(&reqs.iter().map(|r| &r.1).collect::<Vec<_>>());
                    self.log.push(format!("reset, merge of {rows}"));
                }
            }
            12 => {
                let tokens = self.model.offset() + self.rng.range(0, 400);
                self.cache.reserve(tokens).unwrap();
                self.log.push(format!("reserve {tokens}"));
            }
            13 => {
                let row = self.rng.range(0, self.rows() - 1);
                let out = self.cache.extract_row(row).unwrap();
                assert_matches(&out, &self.model.extract(row), &format!("extract {row}, {}", self.what()));
                self.log.push(format!("extract {row}"));
            }
            _ => {
                if self.rng.range(0, 1) == 0 {
                    self.prefill();
                } else {
                    let bytes = save_to_bytes(&[&self.cache]).unwrap();
                    let loaded = load_from_bytes(&bytes).unwrap().pop().unwrap();
                    assert_matches(&loaded, &self.model, &format!("loaded, {}", self.what()));
                    if self.rng.range(0, 1) == 0 {
                        self.cache = loaded;
                        self.log.push("save, load and go on with the loaded cache".into());
                    } else {
                        self.log.push("save and load".into());
                    }
                }
            }
        }
        self.check();
    }
}

fn run_sequence(g: Geometry, seed: u64, steps: usize) -> (usize, usize) {
    let mut run = Run::new(g, seed);
    // Start from a padded batch, a merge of requests, or a batch with reserved slots.
    let rows = run.rng.range(1, 5);
    match run.rng.range(0, 2) {
        0 => {
            let (c, m) = request(g, &mut run.rng, rows, 20, true);
            (run.cache, run.model) = (c, m);
        }
        1 => {
            let reqs: Vec<(LatentCache, Model)> = (0..rows).map(|_| request(g, &mut run.rng, 1, 30, false)).collect();
            run.cache.reserve_rows(rows + run.rng.range(0, 3)).unwrap();
            run.cache.merge_rows(&reqs.iter().map(|r| &r.0).collect::<Vec<_>>()).unwrap();
            run.model = Model::merge(&reqs.iter().map(|r| &r.1).collect::<Vec<_>>());
        }
        _ => {
            run.cache.reserve_rows(8).unwrap();
            let batch = rows;
            append(&mut run.rng, &mut run.cache, &mut run.model, batch, 7);
        }
    }
    run.log.push(format!("start {:?}", run.model.row_offsets()));
    run.check();
    for _ in 0..steps {
        run.step();
    }
    run.joins
}

#[test]
fn random_joins_leaves_and_rounds_match_the_model() {
    for layout in LAYOUTS {
        let mut joins = (0, 0);
        for seed in 0..SEEDS {
            let j = run_sequence(geometry([8, 4, 6], layout), 1000 + seed, 80);
            joins = (joins.0 + j.0, joins.1 + j.1);
        }
        for seed in 0..SEEDS / 4 {
            let j = run_sequence(geometry([8, 4, 0], layout), 2000 + seed, 80);
            joins = (joins.0 + j.0, joins.1 + j.1);
        }
        eprintln!("{layout:?}: {} of {} joins kept the buffers", joins.1, joins.0);
        assert!(joins.1 * 4 > joins.0, "{layout:?}: too few joins took the in-place path to test it");
    }
}

/// Seeds of the random sequences (each about a tenth of a second on two CPU cores).
const SEEDS: u64 = 100;

#[test]
fn random_joins_leaves_and_rounds_in_every_storage_mode() {
    use StorageMode::*;
    let modes = [[Bf16, Bf16, Bf16], [F16, F16, F16], [Q8, Bf16, Q8], [Q4, Q4, Q4], [Fp8, Bf16, Fp8], [Q4, F32, Fp8]];
    for (i, m) in modes.into_iter().enumerate() {
        for layout in LAYOUTS {
            for seed in 0..3 {
                run_sequence(geometry_in([256, 64, 128], m, layout), 3000 + 10 * i as u64 + seed, 30);
            }
        }
    }
}
