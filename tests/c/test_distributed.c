/* A 16K-position prefill handed from one process to another over MLX's ring backend through the
 * C API, under ASan/UBSan: the parent picks two free ports on 127.0.0.1, writes the hostfile and
 * forks; rank 0 fills a three-layer set (float32 with index keys, bfloat16, ragged) and sends its
 * row (`latent_cache_set_send_row`); rank 1 receives it into an empty set, checks every value,
 * decodes on and checks again; then rank 1 refuses a second row (its set holds one) and both
 * sides get a status. Bounded: each process stops itself after two minutes (alarm). */
#define _DEFAULT_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "latent_cache.h"

static int failures = 0;

#include "check.h"
enum { LAYERS = 3, T = 16384, MORE = 8, R = 128, P = 64, K = 128 };

static size_t width(size_t f) { return f == 0 ? R : f == 1 ? P : K; }
static float value_at(size_t layer, size_t pos, size_t f, size_t ch) {
  return (float)((layer * 131 + pos * 7 + f * 3 + ch) % 256) * 0.25f;
}

static void configs(latent_cache_config *cfg) {
  for (int l = 0; l < LAYERS; l++) {
    cfg[l] = latent_cache_config_default();
    cfg[l].kv_lora_rank = R;
    cfg[l].rope_head_dim = P;
    cfg[l].index_head_dim = l == 0 ? K : 0;
  }
  cfg[1].latent_storage = LATENT_CACHE_STORAGE_BF16;
  cfg[1].rope_storage = LATENT_CACHE_STORAGE_BF16;
  cfg[2].layout = LATENT_CACHE_LAYOUT_RAGGED;
}

/* Appends positions [from, to) to every layer. */
static void append(latent_cache_set *set, size_t from, size_t to) {
  static float buf[3][T * K];
  for (size_t l = 0; l < LAYERS; l++) {
    latent_cache *layer = NULL;
    MUST(latent_cache_set_layer(set, l, &layer));
    for (size_t f = 0; f < 3; f++)
      for (size_t t = from; t < to; t++)
        for (size_t c = 0; c < width(f); c++) buf[f][(t - from) * width(f) + c] = value_at(l, t, f, c);
    size_t n = to - from;
    MUST(latent_cache_append_host(layer, 1, n, buf[0], n * R, buf[1], n * P, l == 0 ? buf[2] : NULL, l == 0 ? n * K : 0));
  }
}

static void check_set(latent_cache_set *set, size_t n) {
  static float out[(T + MORE) * K];
  for (size_t l = 0; l < LAYERS; l++) {
    latent_cache *layer = NULL;
    MUST(latent_cache_set_layer(set, l, &layer));
    for (size_t f = 0; f < (l == 0 ? 3u : 2u); f++) {
      size_t written = 0;
      MUST(latent_cache_read_row_host(layer, (uint32_t)f, 0, out, (T + MORE) * K, &written));
      CHECK(written == n * width(f));
      size_t wrong = 0;
      for (size_t t = 0; t < n; t++)
        for (size_t c = 0; c < width(f); c++) wrong += out[t * width(f) + c] != value_at(l, t, f, c);
      CHECK(wrong == 0);
    }
  }
}

static int rank_main(int rank) {
  alarm(120);
  latent_cache_group *g = NULL;
  MUST(latent_cache_group_init("ring", true, &g));
  size_t me = 9, size = 0, n = 0;
  OK(latent_cache_group_info(g, &me, &size));
  CHECK(me == (size_t)rank && size == 2);
  latent_cache_config cfg[LAYERS];
  configs(cfg);
  latent_cache_set *set = NULL;
  MUST(latent_cache_set_new(cfg, LAYERS, &set));
  if (rank == 0) {
    append(set, 0, T);
    OK(latent_cache_set_send_row(set, 0, g, 1, &n));
    CHECK(n == T);
    EXPECT(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_set_send_row(set, 0, g, 1, &n));
  } else {
    OK(latent_cache_set_recv_row(set, g, 0, &n));
    CHECK(n == T);
    check_set(set, T);
    append(set, T, T + MORE);
    check_set(set, T + MORE);
    EXPECT(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_set_recv_row(set, g, 0, &n));
    check_set(set, T + MORE);
  }
  latent_cache_set_free(set);
  latent_cache_group_free(g);
  if (failures) fprintf(stderr, "test_distributed rank %d: %d failure(s)\n", rank, failures);
  return failures != 0;
}

static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
    perror("free_port");
    exit(1);
  }
  close(fd);
  return ntohs(a.sin_port);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_distributed HOSTFILE\n");
    return 2;
  }
  FILE *fp = fopen(argv[1], "w");
  if (!fp) return 2;
  fprintf(fp, "[[\"127.0.0.1:%d\"], [\"127.0.0.1:%d\"]]", free_port(), free_port());
  fclose(fp);
  setenv("MLX_HOSTFILE", argv[1], 1);
  pid_t child = fork();
  if (child == 0) {
    setenv("MLX_RANK", "1", 1);
    _exit(rank_main(1));
  }
  setenv("MLX_RANK", "0", 1);
  int bad = rank_main(0);
  int status = 0;
  waitpid(child, &status, 0);
  bad |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
  if (bad) {
    fprintf(stderr, "test_distributed: failed\n");
    return 1;
  }
  printf("test_distributed: a %d-position row handed over and decoded on, bit for bit\n", T);
  return 0;
}
