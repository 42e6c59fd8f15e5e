/*
** fuzz_wire.c — the Jupyter kernel's wire format (src/kernel/wire.c):
** mg_kmsg_decode on any frames (the delimiter, the signature check, the
** replay check, the four JSON parts, the identities), the number checks of
** requests (mg_kjson_index) and the text sent back (mg_ktext).
**
** The first byte of the input chooses: bit 0, sign the message here with
** the harness's key (so the fuzzer gets past the HMAC to the JSON); bit 1,
** an empty key (signing off). The rest is the frames, one a line ('\n'
** separates them: write the JSON parts on one line each).
**
** Oracles: a message signed here is refused only for its JSON; one that
** decodes with a key decodes once (the same frames again are a replay); its
** header and content are objects; an index is in its range; mg_ktext gives
** valid UTF-8 without NUL. A self-test of the
** signature store (mg_kseen) runs first.
*/
#include "harness.h"
#include "kernel/kernel.h"

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);
int LLVMFuzzerInitialize (int *argc, char ***argv);

#define MAXF 80
static const char KEY[] = "fuzz-key";

/* is s[0..n) valid UTF-8 (no surrogates, no overlongs, at most U+10FFFF) without NUL? */
static int utf8 (const unsigned char *s, size_t n) {
  for (size_t i = 0; i < n;) {
    unsigned c = s[i], len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (c == 0 || len == 0 || i + len > n) return 0;
    unsigned cp = len == 1 ? c : c & (0x7F >> len);
    for (unsigned k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) return 0;
      cp = cp << 6 | (s[i + k] & 0x3F);
    }
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return 0;
    i += len;
  }
  return 1;
}

int LLVMFuzzerInitialize (int *argc, char ***argv) {
  (void)argc, (void)argv;
  FILE *null = fopen("/dev/null", "w");
  if (null) mg_klog_to(fileno(null));           /* "dropped a message" for every input: not wanted */
  /* the signature store: 200000 digests, each new once, then all seen */
  mg_kseen s = {0};
  unsigned char d[MG_KDIGEST] = {0};
  for (int pass = 0; pass < 2; pass++)
    for (uint32_t i = 0; i < 200000; i++) {
      uint64_t x = (uint64_t)i * 0x9E3779B97F4A7C15u;      /* spread, with i = 0 giving 0 */
      memcpy(d, &x, sizeof x);
      memcpy(d + 8, &i, sizeof i);
      CHECK(mg_kseen_add(&s, d) == (pass == 0), "digest %u on pass %d", i, pass);
    }
  CHECK(s.n == 200000 && s.n * 4 <= s.cap * 3, "%zu kept in %zu slots", s.n, s.cap);
  mg_kseen_free(&s);
  return 0;
}

int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int mode = data[0];
  const char *key = (mode & 2) ? "" : KEY;
  /* the frames: the rest split at '\n', each in a buffer of its own size (ASan sees overreads) */
  void *frame[MAXF];
  size_t len[MAXF];
  int n = 0;
  for (size_t at = 1; n < MAXF;) {
    const uint8_t *nl = (const uint8_t *)memchr(data + at, '\n', size - at);
    size_t k = nl ? (size_t)(nl - (data + at)) : size - at;
    frame[n] = malloc(k ? k : 1);
    CHECK(frame[n] != NULL, "out of memory");
    memcpy(frame[n], data + at, k);
    len[n++] = k;
    if (!nl) break;
    at += k + 1;
  }
  int d = 0;
  while (d < n && !(len[d] == 9 && memcmp(frame[d], "<IDS|MSG>", 9) == 0)) d++;
  if ((mode & 1) && n - d >= 6) {                       /* signed as a client with the key would */
    char sig[MG_KHEXSIG + 1];
    CHECK(mg_ksign(key, (const void *const *)(frame + d + 2), len + d + 2, sig) == 0, "mg_ksign");
    free(frame[d + 1]);
    len[d + 1] = strlen(sig);
    frame[d + 1] = malloc(len[d + 1] + 1);
    CHECK(frame[d + 1] != NULL, "out of memory");
    memcpy(frame[d + 1], sig, len[d + 1]);
  }
  mg_kseen seen = {0};
  mg_kmsg m;
  const char *why = NULL;
  int got = mg_kmsg_decode(n, (const void *const *)frame, len, key, &seen, &m, &why);
  if (got == 1) {
    CHECK(cJSON_IsObject(m.header) && cJSON_IsObject(m.content), "decoded without a header or content object");
    CHECK(m.nids == d, "%d identities, %d frames before the delimiter", m.nids, d);
    (void)mg_kmsg_type(&m);
    long v;
    if (mg_kjson_index(m.content, "n", 0, 100, &v)) CHECK(v >= 0 && v < 100, "n = %ld", v);
    if (mg_kjson_index(m.content, "cursor_pos", -5, 3, &v)) CHECK(v >= -5 && v < 3, "cursor_pos = %ld", v);
    mg_kmsg_free(&m);
    mg_kmsg again;
    int twice = mg_kmsg_decode(n, (const void *const *)frame, len, key, &seen, &again, &why);
    if (key[0]) CHECK(twice == 0 && strstr(why, "replay"), "the same message decoded twice");
    else CHECK(twice == 1, "unsigned: decodes again");
    if (twice == 1) mg_kmsg_free(&again);
  } else {
    CHECK(got == 0 && why != NULL && m.header == NULL && m.ids == NULL, "a refusal leaves nothing");
    if ((mode & 1) && n - d >= 6)                     /* signed here: only its JSON can be wrong */
      CHECK(strstr(why, "JSON") != NULL, "signed with the key, refused: %s", why);
  }
  mg_kseen_free(&seen);
  cJSON *text = mg_ktext((const char *)data, size);
  CHECK(cJSON_IsString(text) && utf8((const unsigned char *)text->valuestring, strlen(text->valuestring)),
        "mg_ktext gave invalid UTF-8");
  cJSON_Delete(text);
  for (int i = 0; i < n; i++) free(frame[i]);
  return 0;
}
