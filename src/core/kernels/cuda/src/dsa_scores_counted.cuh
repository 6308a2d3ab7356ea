//! Header of the index-score kernel that also counts its scores' top-k histogram (before the
//! index-score and top-k headers): DSA's selection in two operations, not three.

#define LC_SCORES_COUNT 1
