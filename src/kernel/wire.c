/*
** wire.c — Jupyter's wire format (messaging protocol 5.3) over ZeroMQ:
**
**   [identities...] "<IDS|MSG>" signature header parent_header metadata content
**
** The signature is the hex HMAC-SHA256 (OpenSSL) of the four JSON parts
** with the connection file's key. A received message whose signature is
** missing or wrong is dropped and logged before anything reads it; the
** comparison takes the same time wherever the strings differ
** (CRYPTO_memcmp). A signature seen before is a replay, dropped too (as
** jupyter_client's Session keeps a digest history). An empty key means
** signing is off, as Jupyter has it.
*/
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <zmq.h>

#include "kernel/kernel.h"

#define DELIM     "<IDS|MSG>"
#define HEXSIG    (2 * 32)              /* SHA-256, in hex */
#define MAXFRAMES 64                    /* identities + 6 + buffers: more is not a client */
#define SEEN      4096                  /* signatures remembered against replays */

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

/* hex HMAC-SHA256 of the parts, or "" with no key; 0, or -1 out of memory */
static int sign (const char *key, const char *const part[4], const size_t len[4], char out[HEXSIG + 1]) {
  out[0] = '\0';
  if (key[0] == '\0') return 0;
  size_t total = len[0] + len[1] + len[2] + len[3];
  unsigned char *all = malloc(total ? total : 1), md[EVP_MAX_MD_SIZE];
  if (all == NULL) return -1;
  for (size_t i = 0, at = 0; i < 4; at += len[i], i++) memcpy(all + at, part[i], len[i]);
  unsigned int mdlen = 0;
  unsigned char *ok = HMAC(EVP_sha256(), key, (int)strlen(key), all, total, md, &mdlen);
  free(all);
  if (ok == NULL) return -1;
  for (unsigned int i = 0; i < mdlen; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
  return 0;
}

/* was sig (HEXSIG characters) seen among the last SEEN? remembers it if not */
static int replayed (const char *sig) {
  static char seen[SEEN][HEXSIG];
  static size_t next, filled;
  for (size_t i = 0; i < filled; i++)
    if (memcmp(seen[i], sig, HEXSIG) == 0) return 1;
  memcpy(seen[next], sig, HEXSIG);
  next = (next + 1) % SEEN;
  if (filled < SEEN) filled++;
  return 0;
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

static cJSON *parse_part (zmq_msg_t *m) {
  return cJSON_ParseWithLength((const char *)zmq_msg_data(m), zmq_msg_size(m));
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

static int drop (frames *fs, const char *why) {
  mg_klog("dropped a message: %s", why);
  frames_close(fs);
  return 0;
}

int mg_kmsg_recv (void *sock, const char *key, mg_kmsg *m) {
  frames fs;
  memset(m, 0, sizeof *m);
  int got = frames_recv(sock, &fs);
  if (got < 0) return -1;
  if (got == 0) return drop(&fs, "too many frames");
  int d = 0;
  while (d < fs.n && !(zmq_msg_size(&fs.f[d]) == sizeof DELIM - 1 &&
                       memcmp(zmq_msg_data(&fs.f[d]), DELIM, sizeof DELIM - 1) == 0)) d++;
  if (fs.n - d < 6) return drop(&fs, "not a Jupyter message (no <IDS|MSG> and five parts after it)");
  const char *part[4];
  size_t len[4];
  for (int i = 0; i < 4; i++) {
    part[i] = (const char *)zmq_msg_data(&fs.f[d + 2 + i]);
    len[i] = zmq_msg_size(&fs.f[d + 2 + i]);
  }
  if (key[0]) {
    char want[HEXSIG + 1];
    if (sign(key, part, len, want) != 0) return drop(&fs, "out of memory checking its signature");
    zmq_msg_t *sig = &fs.f[d + 1];
    if (zmq_msg_size(sig) != HEXSIG) return drop(&fs, zmq_msg_size(sig) ? "its signature is not an HMAC-SHA256"
                                                                        : "it is not signed");
    if (CRYPTO_memcmp(zmq_msg_data(sig), want, HEXSIG) != 0) return drop(&fs, "wrong signature");
    if (replayed(want)) return drop(&fs, "a replay (its signature was seen before)");
  }
  m->header = parse_part(&fs.f[d + 2]);
  m->parent = parse_part(&fs.f[d + 3]);
  m->metadata = parse_part(&fs.f[d + 4]);
  m->content = parse_part(&fs.f[d + 5]);
  m->ids = calloc((size_t)d + 1, sizeof *m->ids);
  m->idlen = calloc((size_t)d + 1, sizeof *m->idlen);
  int ok = cJSON_IsObject(m->header) && cJSON_IsObject(m->content) && m->ids && m->idlen;
  for (int i = 0; ok && i < d; i++) {
    m->idlen[i] = zmq_msg_size(&fs.f[i]);
    m->ids[i] = malloc(m->idlen[i] ? m->idlen[i] : 1);
    if (m->ids[i] == NULL) ok = 0;
    else memcpy(m->ids[i], zmq_msg_data(&fs.f[i]), m->idlen[i]);
    m->nids = i + 1;
  }
  if (!ok) {
    mg_kmsg_free(m);
    return drop(&fs, "its header or content is not a JSON object");
  }
  frames_close(&fs);
  return 1;
}

const char *mg_kmsg_type (const mg_kmsg *m) {
  cJSON *t = cJSON_GetObjectItemCaseSensitive(m->header, "msg_type");
  return cJSON_IsString(t) ? t->valuestring : "";
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
    rc = sign(key, (const char *const *)part, len, sig);
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
