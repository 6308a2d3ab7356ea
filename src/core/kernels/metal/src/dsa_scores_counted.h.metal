//! Header of the Metal index-score kernel that also counts its scores' top-k histogram (before
//! the top-k header, for its order key): DSA's selection in two operations, not three.

#define LC_SCORES_COUNT 1
