/*
** kernel.h — the plain-C half of the Jupyter kernel: the connection file,
** the wire format with its HMAC-SHA256 signatures (wire.c), and the
** kernelspec (install.c). The Lua half is src/kernel/lkernel.c.
*/
#ifndef MG_KERNEL_H
#define MG_KERNEL_H

#include <stddef.h>
#include <stdint.h>
#include <cjson/cJSON.h>

/*
** The most bytes one frame of a message may have (ZMQ_MAXMSGSIZE on every
** socket): 16 MiB, above any cell's code, and above the 10 MiB a notebook
** server's websocket passes by default. A peer that sends more is
** disconnected by ZeroMQ as soon as the frame's length is read, before the
** frame is stored (its client reconnects); the kernel never sees it.
*/
#define MG_KMAXFRAME  ((int64_t)16 << 20)

#define MG_KDIGEST    32                /* an HMAC-SHA256, in bytes */
#define MG_KHEXSIG    (2 * MG_KDIGEST)  /* and in hex, as the wire has it */

/* what the connection file says */
typedef struct mg_kconn {
  char transport[8];            /* "tcp" or "ipc" */
  char ip[256];                 /* an address for tcp, a path prefix for ipc */
  char key[512];                /* the HMAC key; empty: messages are not signed */
  int  port[5];                 /* shell, iopub, stdin, control, hb */
} mg_kconn;

enum { MG_KSHELL, MG_KIOPUB, MG_KSTDIN, MG_KCONTROL, MG_KHB };

/* reads path; 0, or -1 with the reason in err */
int  mg_kconn_read (const char *path, mg_kconn *c, char *err, size_t errlen);
/* the endpoint of socket which, as zmq_bind wants it */
void mg_kconn_endpoint (const mg_kconn *c, int which, char *buf, size_t n);

/* a message as received: the routing identities, and its four JSON parts */
typedef struct mg_kmsg {
  void  **ids;
  size_t *idlen;
  int     nids;
  cJSON  *header, *parent, *metadata, *content;
} mg_kmsg;

/* the signatures seen (wire.c): 8 bytes of each, kept for the kernel's life;
** {0} is an empty one */
typedef struct mg_kseen { uint64_t *slot; size_t cap, n; } mg_kseen;
/* 1: digest is new (now remembered); 0: seen before; -1: out of memory */
int  mg_kseen_add (mg_kseen *s, const unsigned char digest[MG_KDIGEST]);
void mg_kseen_free (mg_kseen *s);

/*
** Receives one message from sock and decodes it (mg_kmsg_decode). 1: m
** holds it; 0: it was dropped (logged, nothing else done); -1: no message
** (EINTR, EAGAIN, the context ended).
*/
int  mg_kmsg_recv (void *sock, const char *key, mg_kseen *seen, mg_kmsg *m);
/*
** One message from its n frames (frame[i], len[i] bytes): finds <IDS|MSG>;
** with a key, checks the signature (the HMAC of the four parts, computed
** where they lie, compared in constant time) and refuses one in seen (a
** replay), remembering it otherwise; then parses the JSON parts and copies
** the identities. 1: m holds it; 0: dropped, *why says why (m is empty).
*/
int  mg_kmsg_decode (int n, const void *const frame[], const size_t len[], const char *key, mg_kseen *seen,
                     mg_kmsg *m, const char **why);
void mg_kmsg_free (mg_kmsg *m);
/* the msg_type of m's header ("" if none) */
const char *mg_kmsg_type (const mg_kmsg *m);

/*
** Sends a message of msg_type with content (taken: freed here) as a reply
** to parent (its header; NULL for none) to the identities of to (NULL: to
** the topic msg_type, for iopub); session is the kernel's. 0 or -1.
*/
int  mg_kmsg_send (void *sock, const char *key, const char *session, const mg_kmsg *to,
                   const cJSON *parent, const char *msg_type, cJSON *content);

/* the hex HMAC-SHA256 of the four parts with key, or "" for an empty key
** (signing off); 0, or -1 (out of memory) */
int  mg_ksign (const char *key, const void *const part[4], const size_t len[4], char out[MG_KHEXSIG + 1]);

/* j[key] as a whole index in [lo, hi) (a fraction is cut): 1 and *out; 0
** when it is missing, not a number or outside (checked before any cast) */
int  mg_kjson_index (const cJSON *j, const char *key, long lo, long hi, long *out);

/* s[0..n) as a JSON string of valid UTF-8 (a client drops a message that is
** not): a byte that starts no valid character, or a NUL, becomes U+FFFD */
cJSON *mg_ktext (const char *s, size_t n);

/* output.c: fds 1 and 2 as pipes, read by a thread that hands what comes to
** fn(ud, "stdout" or "stderr", text, n) */
typedef struct mg_kout mg_kout;
typedef void (*mg_kout_fn) (void *ud, const char *name, const char *text, size_t n);
/* redirects and starts reading (stdin from /dev/null too); *origerr: a dup of
** the stderr there was; NULL when it could not (errno set) */
mg_kout *mg_kout_start (mg_kout_fn fn, void *ud, int *origerr);
/* flushes, and returns once everything written so far is handed over */
void mg_kout_sync (mg_kout *o);
/* hands over the rest, restores fds 1 and 2, ends the thread */
void mg_kout_stop (mg_kout *o);

/* a fresh random UUID (36 characters and a NUL) */
void mg_kuuid (char out[37]);
/* base64 of data, malloc'd (NULL when out of memory) */
char *mg_kbase64 (const void *data, size_t n);
/* the kernel's log (the stderr Jupyter was given, not the notebook's) */
void mg_klog (const char *fmt, ...);
void mg_klog_to (int fd);

/* moongrad --install-kernel [--user] [--prefix P]: the kernelspec */
int  mg_kernel_install (int argc, char **argv);

#endif
