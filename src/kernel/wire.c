/*
** wire.c — Jupyter's wire format (messaging protocol 5.3) over ZeroMQ:
**
**   [identities...] "<IDS|MSG>" signature header parent_header metadata content
**
** The signature is the hex HMAC-SHA256 (OpenSSL) of the four JSON parts
** with the connection file's key, computed over the frames where ZeroMQ
** left them (nothing is copied before the signature is known good). A
** received message whose signature is missing or wrong is dropped and
** logged before anything reads it; the comparison takes the same time
** wherever the strings differ (CRYPTO_memcmp). A signature seen before is a
** replay, dropped too: every good signature is remembered for the kernel's
** life (jupyter_client's Session keeps the last 2^16), as 8 bytes of its
** digest in a hash set (mg_kseen). An empty key means signing is off, as
** Jupyter has it. The kernel's sockets take frames of at most MG_KMAXFRAME
** bytes (kernel.h).
*/
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <zmq.h>

#include "kernel/kernel.h"

#define DELIM     "<IDS|MSG>"
#define DIGEST    32                    /* SHA-256 */
#define HEXSIG    (2 * DIGEST)          /* in hex */
_Static_assert(DIGEST == MG_KDIGEST && HEXSIG == MG_KHEXSIG, "kernel.h's sizes");
#define MAXFRAMES 64                    /* identities + 6 + buffers: more is not a client */

/* {======================== the log ======================== */

static FILE *logfile;

void mg_klog_to (int fd) {
  if (logfile) fclose(logfile);
  logfile = fd >= 0 ? fdopen(fd, "w") : NULL;
}

void mg_klog (const char *fmt, ...) {
  FILE *f = logfile ? logfile : stderr;
  va_list ap;
  va_start(ap, fmt);
  fputs("moongrad kernel: ", f);
  vfprintf(f, fmt, ap);
  fputc('\n', f);
  fflush(f);
  va_end(ap);
}

/* }========================================================== */


/* {=================== the connection file =================== */

static int getstr (cJSON *j, const char *k, char *out, size_t n, const char *dflt) {
  cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  const char *s = cJSON_IsString(v) ? v->valuestring : dflt;
  if (s == NULL || strlen(s) >= n) return -1;
  strcpy(out, s);
  return 0;
}

int mg_kconn_read (const char *path, mg_kconn *c, char *err, size_t errlen) {
  static const char *const ports[] = {"shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"};
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    snprintf(err, errlen, "cannot open the connection file '%s' (%s)", path, strerror(errno));
    return -1;
  }
  char buf[16384];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  cJSON *j = cJSON_Parse(buf);
  if (j == NULL) {
    snprintf(err, errlen, "the connection file '%s' is not JSON", path);
    return -1;
  }
  int rc = -1;
  char scheme[32];
  memset(c, 0, sizeof *c);
  if (getstr(j, "transport", c->transport, sizeof c->transport, "tcp") != 0 ||
      (strcmp(c->transport, "tcp") != 0 && strcmp(c->transport, "ipc") != 0)) {
    snprintf(err, errlen, "transport must be \"tcp\" or \"ipc\"");
  } else if (getstr(j, "ip", c->ip, sizeof c->ip, "127.0.0.1") != 0) {
    snprintf(err, errlen, "ip must be a string of at most %zu characters", sizeof c->ip - 1);
  } else if (getstr(j, "key", c->key, sizeof c->key, "") != 0) {
    snprintf(err, errlen, "key must be a string of at most %zu characters", sizeof c->key - 1);
  } else if (getstr(j, "signature_scheme", scheme, sizeof scheme, "hmac-sha256") != 0 ||
             (c->key[0] && strcmp(scheme, "hmac-sha256") != 0)) {
    snprintf(err, errlen, "signature_scheme must be \"hmac-sha256\" (the one this kernel knows)");
  } else {
    rc = 0;
    for (int i = 0; i < 5 && rc == 0; i++) {
      cJSON *p = cJSON_GetObjectItemCaseSensitive(j, ports[i]);
      if (!cJSON_IsNumber(p) || p->valuedouble < 1 || p->valuedouble > 65535) {
        snprintf(err, errlen, "%s must be a port number (1 to 65535)", ports[i]);
        rc = -1;
      } else {
        c->port[i] = (int)p->valuedouble;
      }
    }
  }
  cJSON_Delete(j);
  return rc;
}

/* tcp://ip:port, or ipc://ip-port (Jupyter's way of naming ipc files) */
void mg_kconn_endpoint (const mg_kconn *c, int which, char *buf, size_t n) {
  if (strcmp(c->transport, "ipc") == 0) snprintf(buf, n, "ipc://%s-%d", c->ip, c->port[which]);
  else snprintf(buf, n, "tcp://%s:%d", c->ip, c->port[which]);
}

/* }========================================================== */


/* {======================== signatures ======================= */

/* HMAC-SHA256 of the four parts with key, read where they lie; 0 or -1 */
static int hmac (const char *key, const void *const part[4], const size_t len[4], unsigned char md[DIGEST]) {
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  char digest[] = "SHA256";
  OSSL_PARAM params[2] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                          OSSL_PARAM_construct_end()};
  size_t n = 0;
  int ok = ctx && EVP_MAC_init(ctx, (const unsigned char *)key, strlen(key), params);
  for (int i = 0; ok && i < 4; i++) ok = len[i] == 0 || EVP_MAC_update(ctx, part[i], len[i]);
  ok = ok && EVP_MAC_final(ctx, md, &n, DIGEST) && n == DIGEST;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  return ok ? 0 : -1;
}

static void tohex (const unsigned char md[DIGEST], char out[HEXSIG + 1]) {
  static const char hex[] = "0123456789abcdef";
  for (int i = 0; i < DIGEST; i++) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  out[HEXSIG] = '\0';
}

int mg_ksign (const char *key, const void *const part[4], const size_t len[4], char out[MG_KHEXSIG + 1]) {
  unsigned char md[DIGEST];
  out[0] = '\0';
  if (key[0] == '\0') return 0;
  if (hmac(key, part, len, md) != 0) return -1;
  tohex(md, out);
  return 0;
}

/*
** The signatures seen: the first 8 bytes of each digest (HMAC output, so
** uniform: they are their own hash) in an open-addressed table, at most 3/4
** full, doubled when it would be more. 0 marks a free slot (a digest whose
** 8 bytes are 0 is kept as 1). Two messages are taken for one only if 64
** bits of their HMACs agree: about 3 in 10^8 after 10^6 messages.
*/
static size_t seen_slot (const mg_kseen *s, uint64_t v) {
  size_t i = (size_t)v & (s->cap - 1);
  while (s->slot[i] != 0 && s->slot[i] != v) i = (i + 1) & (s->cap - 1);
  return i;
}

static int seen_grow (mg_kseen *s) {
  mg_kseen t = {NULL, s->cap ? 2 * s->cap : 1024, s->n};
  if (t.cap > SIZE_MAX / 2 / sizeof *t.slot || (t.slot = calloc(t.cap, sizeof *t.slot)) == NULL) return -1;
  for (size_t i = 0; i < s->cap; i++)
    if (s->slot[i] != 0) t.slot[seen_slot(&t, s->slot[i])] = s->slot[i];
  free(s->slot);
  *s = t;
  return 0;
}

int mg_kseen_add (mg_kseen *s, const unsigned char digest[MG_KDIGEST]) {
  uint64_t v;
  memcpy(&v, digest, sizeof v);
  if (v == 0) v = 1;
  if ((s->n + 1) * 4 > s->cap * 3 && seen_grow(s) != 0) return -1;
  size_t i = seen_slot(s, v);
  if (s->slot[i] == v) return 0;
  s->slot[i] = v;
  s->n++;
  return 1;
}

void mg_kseen_free (mg_kseen *s) {
  free(s->slot);
  memset(s, 0, sizeof *s);
}

/* }========================================================== */


/* {========================= receiving ======================= */

typedef struct { zmq_msg_t f[MAXFRAMES]; int n; } frames;

static void frames_close (frames *fs) {
  for (int i = 0; i < fs->n; i++) zmq_msg_close(&fs->f[i]);
  fs->n = 0;
}

/* all the frames of one multipart message (more than MAXFRAMES: the rest is read and dropped) */
static int frames_recv (void *sock, frames *fs) {
  fs->n = 0;
  int more = 1, overflow = 0;
  while (more) {
    zmq_msg_t tmp, *m = fs->n < MAXFRAMES ? &fs->f[fs->n] : &tmp;
    zmq_msg_init(m);
    int rc;
    do rc = zmq_msg_recv(m, sock, fs->n == 0 ? ZMQ_DONTWAIT : 0);
    while (rc < 0 && errno == EINTR && fs->n > 0);      /* inside a message: finish it */
    if (rc < 0) {
      zmq_msg_close(m);
      frames_close(fs);
      return -1;
    }
    more = zmq_msg_more(m);
    if (m == &tmp) { zmq_msg_close(m); overflow = 1; }
    else fs->n++;
  }
  return overflow ? 0 : 1;
}

static cJSON *parse_part (const void *data, size_t n) {
  return n ? cJSON_ParseWithLength((const char *)data, n) : NULL;
}

void mg_kmsg_free (mg_kmsg *m) {
  for (int i = 0; i < m->nids; i++) free(m->ids[i]);
  free(m->ids);
  free(m->idlen);
  cJSON_Delete(m->header);
  cJSON_Delete(m->parent);
  cJSON_Delete(m->metadata);
  cJSON_Delete(m->content);
  memset(m, 0, sizeof *m);
}

/* 0, with *why; nothing is kept */
static int refuse (mg_kmsg *m, const char **why, const char *reason) {
  mg_kmsg_free(m);
  *why = reason;
  return 0;
}

int mg_kmsg_decode (int n, const void *const frame[], const size_t len[], const char *key, mg_kseen *seen,
                    mg_kmsg *m, const char **why) {
  memset(m, 0, sizeof *m);
  int d = 0;
  while (d < n && !(len[d] == sizeof DELIM - 1 && memcmp(frame[d], DELIM, sizeof DELIM - 1) == 0)) d++;
  if (n - d < 6) return refuse(m, why, "not a Jupyter message (no <IDS|MSG> and five parts after it)");
  const void *const *part = frame + d + 2;
  const size_t *plen = len + d + 2;
  if (key[0]) {
    unsigned char md[DIGEST];
    char want[HEXSIG + 1];
    if (len[d + 1] != HEXSIG)
      return refuse(m, why, len[d + 1] ? "its signature is not an HMAC-SHA256" : "it is not signed");
    if (hmac(key, part, plen, md) != 0) return refuse(m, why, "out of memory checking its signature");
    tohex(md, want);
    if (CRYPTO_memcmp(frame[d + 1], want, HEXSIG) != 0) return refuse(m, why, "wrong signature");
    int fresh = mg_kseen_add(seen, md);
    if (fresh < 0) return refuse(m, why, "out of memory remembering its signature");
    if (fresh == 0) return refuse(m, why, "a replay (its signature was seen before)");
  }
  m->header = parse_part(part[0], plen[0]);
  m->parent = parse_part(part[1], plen[1]);
  m->metadata = parse_part(part[2], plen[2]);
  m->content = parse_part(part[3], plen[3]);
  if (!cJSON_IsObject(m->header) || !cJSON_IsObject(m->content))
    return refuse(m, why, "its header or content is not a JSON object");
  m->ids = calloc((size_t)d + 1, sizeof *m->ids);
  m->idlen = calloc((size_t)d + 1, sizeof *m->idlen);
  if (m->ids == NULL || m->idlen == NULL) return refuse(m, why, "out of memory");
  for (int i = 0; i < d; i++) {
    m->idlen[i] = len[i];
    if ((m->ids[i] = malloc(len[i] ? len[i] : 1)) == NULL) return refuse(m, why, "out of memory");
    if (len[i]) memcpy(m->ids[i], frame[i], len[i]);
    m->nids = i + 1;
  }
  return 1;
}

int mg_kmsg_recv (void *sock, const char *key, mg_kseen *seen, mg_kmsg *m) {
  frames fs;
  memset(m, 0, sizeof *m);
  int got = frames_recv(sock, &fs);
  if (got < 0) return -1;
  const char *why = "too many frames";
  if (got > 0) {
    const void *data[MAXFRAMES];
    size_t len[MAXFRAMES];
    for (int i = 0; i < fs.n; i++) {
      data[i] = zmq_msg_data(&fs.f[i]);
      len[i] = zmq_msg_size(&fs.f[i]);
    }
    got = mg_kmsg_decode(fs.n, data, len, key, seen, m, &why);
  }
  if (got == 0) mg_klog("dropped a message: %s", why);
  frames_close(&fs);
  return got;
}

const char *mg_kmsg_type (const mg_kmsg *m) {
  cJSON *t = cJSON_GetObjectItemCaseSensitive(m->header, "msg_type");
  return cJSON_IsString(t) ? t->valuestring : "";
}

int mg_kjson_index (const cJSON *j, const char *key, long lo, long hi, long *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
  if (!cJSON_IsNumber(v)) return 0;
  double d = v->valuedouble;                    /* NaN fails both tests */
  if (!(d >= (double)lo && d < (double)hi)) return 0;
  *out = (long)d;
  return 1;
}

/* }========================================================== */


/* {========================== sending ======================== */

void mg_kuuid (char out[37]) {
  unsigned char b[16];
  if (RAND_bytes(b, sizeof b) != 1) {           /* not for security: ids only */
    for (int i = 0; i < 16; i++) b[i] = (unsigned char)rand();
  }
  b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
  b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

char *mg_kbase64 (const void *data, size_t n) {
  char *out = malloc(4 * ((n + 2) / 3) + 1);
  if (out != NULL) EVP_EncodeBlock((unsigned char *)out, data, (int)n);
  return out;
}

/* valid UTF-8 text for a message (see kernel.h) */
cJSON *mg_ktext (const char *s, size_t n) {
  char *out = malloc(3 * n + 1), *o = out;
  if (out == NULL) return cJSON_CreateNull();
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)s[i], c1 = i + 1 < n ? (unsigned char)s[i + 1] : 0;
    size_t len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    int ok = len > 0 && c != 0 && i + len <= n &&
             !(c == 0xE0 && c1 < 0xA0) && !(c == 0xED && c1 >= 0xA0) &&        /* overlong, surrogate */
             !(c == 0xF0 && c1 < 0x90) && !(c == 0xF4 && c1 >= 0x90);          /* overlong, past U+10FFFF */
    for (size_t j = 1; ok && j < len; j++) ok = ((unsigned char)s[i + j] & 0xC0) == 0x80;
    if (!ok) len = 1;
    memcpy(o, ok ? s + i : "\xEF\xBF\xBD", ok ? len : 3);
    o += ok ? len : 3;
    i += len;
  }
  *o = '\0';
  cJSON *j = cJSON_CreateString(out);
  free(out);
  return j;
}

/* now, as ISO 8601 in UTC with microseconds */
static void now_iso (char out[40]) {
  struct timespec ts;
  struct tm tm;
  clock_gettime(CLOCK_REALTIME, &ts);
  gmtime_r(&ts.tv_sec, &tm);
  size_t k = strftime(out, 40, "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out + k, 40 - k, ".%06ldZ", ts.tv_nsec / 1000);
}

static cJSON *new_header (const char *session, const char *msg_type) {
  char id[37], date[40];
  mg_kuuid(id);
  now_iso(date);
  cJSON *h = cJSON_CreateObject();
  cJSON_AddStringToObject(h, "msg_id", id);
  cJSON_AddStringToObject(h, "session", session);
  cJSON_AddStringToObject(h, "username", "moongrad");
  cJSON_AddStringToObject(h, "date", date);
  cJSON_AddStringToObject(h, "msg_type", msg_type);
  cJSON_AddStringToObject(h, "version", "5.3");
  return h;
}

static int send_part (void *sock, const void *data, size_t n, int more) {
  int rc;
  do rc = zmq_send(sock, data, n, more ? ZMQ_SNDMORE : 0);
  while (rc < 0 && errno == EINTR);
  return rc < 0 ? -1 : 0;
}

int mg_kmsg_send (void *sock, const char *key, const char *session, const mg_kmsg *to,
                  const cJSON *parent, const char *msg_type, cJSON *content) {
  cJSON *header = new_header(session, msg_type);
  char *part[4] = {cJSON_PrintUnformatted(header),
                   parent ? cJSON_PrintUnformatted(parent) : strdup("{}"), strdup("{}"),
                   content ? cJSON_PrintUnformatted(content) : strdup("{}")};
  cJSON_Delete(header);
  cJSON_Delete(content);
  int rc = -1;
  char sig[HEXSIG + 1];
  size_t len[4];
  if (part[0] && part[1] && part[2] && part[3]) {
    for (int i = 0; i < 4; i++) len[i] = strlen(part[i]);
    rc = mg_ksign(key, (const void *const *)part, len, sig);
  }
  if (rc == 0) {
    if (to != NULL) {
      for (int i = 0; i < to->nids && rc == 0; i++) rc = send_part(sock, to->ids[i], to->idlen[i], 1);
    } else {
      rc = send_part(sock, msg_type, strlen(msg_type), 1);           /* the iopub topic */
    }
    if (rc == 0) rc = send_part(sock, DELIM, sizeof DELIM - 1, 1);
    if (rc == 0) rc = send_part(sock, sig, strlen(sig), 1);
    for (int i = 0; i < 4 && rc == 0; i++) rc = send_part(sock, part[i], len[i], i < 3);
  }
  for (int i = 0; i < 4; i++) free(part[i]);
  if (rc != 0) mg_klog("could not send a %s (%s)", msg_type, zmq_strerror(errno));
  return rc;
}

/* }========================================================== */
