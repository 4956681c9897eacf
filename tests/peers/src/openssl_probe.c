/*
 * openssl-probe: kubeconfig-probe's twin on OpenSSL, for hubs whose TLS is OpenSSL's (curl, Python, Ruby, nginx,
 * anything on libssl). The chain is built and verified by OpenSSL's own X509_verify_cert with the CA certificates
 * in an X509_STORE, as curl does with a CA bundle: an issuer is looked up by subject name (and the leaf's authority
 * key identifier when it has one), so two CAs of one subject in the bundle behave for it as they do for curl.
 *
 * Every -every (default 100ms) it POSTs a SelfSubjectReview to the current context's server (or to the -server
 * given, keeping the kubeconfig server's path) over a new TCP and TLS connection: the host resolved through the C
 * library's getaddrinfo (the pod's /etc/resolv.conf and /etc/hosts), the client certificate and key of the
 * kubeconfig, the server verified with its certificate-authority-data, or with the -ca file when one is given, and
 * for its host name. A request fails unless it is answered 201 naming the expected user.
 *
 * What it reads, and when (-reload):
 *   request  every file before every request;
 *   change   the kubeconfig again whenever the file changed (inode, size or mtime: the kubelet swaps a mounted
 *            Secret's files atomically); the -ca file only on SIGHUP (what the ca-syncer sidecar sends);
 *   once     both at start only (a read-once consumer, which a restart reloads); SIGHUP still reloads both.
 *
 * Output, line-buffered, as kubeconfig-probe's: "fail <n> <class> <why>" per failure, class one of resolution,
 * connect, tls, timeout, 401, 403, 5xx, http (another status), user (another user), config (the files); "cert
 * <serial> notAfter <RFC 3339>" whenever the client certificate changes; "server <serial> authorityKeyId
 * <aa:bb:..>" whenever the server's certificate changes; "reload <what>" whenever a file was read again with new
 * content; after the first handshake and on the first few TLS failures, "chain ..." and "trust ..." lines
 * describing the chain the server sent and the CA certificates it was checked against (subject, issuer, key
 * identifiers, serial, notAfter), and a summary every second and at SIGTERM: "requests <n> failures <n> certs <n>".
 * Before its first request it waits until the files can be read and the server's name resolves ("ready after <n>
 * check(s)"), as a hub waits for its configuration: nothing is counted before.
 *
 * Usage: openssl-probe -kubeconfig FILE -user NAME [-ca FILE] [-server https://HOST:PORT] [-every 100ms]
 *                      [-reload request|change|once]
 *
 * Built with gcc -static against Debian's libssl.a and libcrypto.a (libssl-dev) and glibc, whose static
 * getaddrinfo has the files and dns lookups built in: the binary runs in a FROM-scratch image. It prints the
 * OpenSSL version it was linked with first ("openssl <version>").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define TIMEOUT_SECONDS 10

static volatile sig_atomic_t hup, term;

static void on_hup(int sig) {
    (void)sig;
    hup = 1;
}

static void on_term(int sig) {
    (void)sig;
    term = 1;
}

/* ---------- a small reader of block YAML, as kubeconfig writers emit it ---------- */

enum kind { SCALAR, MAP, SEQ };

struct node {
    enum kind kind;
    char *key; /* in a MAP's children */
    char *value; /* SCALAR; NULL for null */
    struct node **kids;
    int n;
};

struct line {
    int indent;
    char *text;
};

struct parser {
    struct line *lines;
    int n, i;
};

static struct node *new_node(enum kind kind) {
    struct node *nd = calloc(1, sizeof *nd);
    nd->kind = kind;
    return nd;
}

static void add_kid(struct node *parent, struct node *kid) {
    parent->kids = realloc(parent->kids, (parent->n + 1) * sizeof *parent->kids);
    parent->kids[parent->n++] = kid;
}

static void free_node(struct node *nd) {
    if (!nd) return;
    for (int i = 0; i < nd->n; i++) free_node(nd->kids[i]);
    free(nd->kids);
    free(nd->key);
    free(nd->value);
    free(nd);
}

static char *unquote(const char *s) {
    size_t len = strlen(s);
    if (len >= 2 && s[0] == '"' && s[len - 1] == '"') {
        char *out = malloc(len), *o = out;
        for (size_t i = 1; i + 1 < len; i++) {
            if (s[i] == '\\' && i + 2 < len) {
                i++;
                *o++ = s[i] == 'n' ? '\n' : s[i] == 't' ? '\t' : s[i];
            } else {
                *o++ = s[i];
            }
        }
        *o = 0;
        return out;
    }
    if (len >= 2 && s[0] == '\'' && s[len - 1] == '\'') {
        char *out = malloc(len), *o = out;
        for (size_t i = 1; i + 1 < len; i++) {
            *o++ = s[i];
            if (s[i] == '\'' && s[i + 1] == '\'') i++;
        }
        *o = 0;
        return out;
    }
    return strdup(s);
}

static int is_item(const char *text) { return (text[0] == '-' && (text[1] == ' ' || text[1] == 0)); }

static struct node *block(struct parser *p, int indent);

static struct node *sequence(struct parser *p, int indent) {
    struct node *out = new_node(SEQ);
    while (p->i < p->n && p->lines[p->i].indent == indent && is_item(p->lines[p->i].text)) {
        char *rest = p->lines[p->i].text + 1;
        while (*rest == ' ') rest++;
        if (!*rest) {
            p->i++;
            if (p->i >= p->n || p->lines[p->i].indent <= indent) {
                add_kid(out, new_node(SCALAR));
                continue;
            }
            add_kid(out, block(p, p->lines[p->i].indent));
            continue;
        }
        /* "- key: value" starts a mapping whose keys sit where "key" does. */
        p->lines[p->i].indent = indent + 2;
        p->lines[p->i].text = rest;
        add_kid(out, block(p, indent + 2));
    }
    return out;
}

static struct node *mapping(struct parser *p, int indent) {
    struct node *out = new_node(MAP);
    while (p->i < p->n && p->lines[p->i].indent == indent && !is_item(p->lines[p->i].text)) {
        char *text = p->lines[p->i].text;
        char *colon = strstr(text, ": ");
        size_t len = strlen(text);
        if (!colon && len && text[len - 1] == ':') colon = text + len - 1;
        p->i++;
        if (!colon) continue; /* not a mapping entry: ignored */
        char *key = strndup(text, colon - text);
        char *value = colon + 1;
        while (*value == ' ') value++;
        struct node *kid;
        if (*value) {
            kid = new_node(SCALAR);
            kid->value = unquote(value);
        } else if (p->i < p->n && (p->lines[p->i].indent > indent ||
                                   (p->lines[p->i].indent == indent && is_item(p->lines[p->i].text)))) {
            kid = block(p, p->lines[p->i].indent);
        } else {
            kid = new_node(SCALAR);
        }
        kid->key = unquote(key);
        free(key);
        add_kid(out, kid);
    }
    return out;
}

static struct node *block(struct parser *p, int indent) {
    return is_item(p->lines[p->i].text) ? sequence(p, indent) : mapping(p, indent);
}

/* Parses text (modified in place); NULL when empty. */
static struct node *parse_yaml(char *text) {
    struct parser p = {0};
    for (char *save = NULL, *raw = strtok_r(text, "\n", &save); raw; raw = strtok_r(NULL, "\n", &save)) {
        int indent = 0;
        while (raw[indent] == ' ') indent++;
        char *t = raw + indent;
        size_t len = strlen(t);
        while (len && (t[len - 1] == ' ' || t[len - 1] == '\r')) t[--len] = 0;
        if (!len || t[0] == '#' || !strcmp(t, "---")) continue;
        p.lines = realloc(p.lines, (p.n + 1) * sizeof *p.lines);
        p.lines[p.n++] = (struct line){indent, t};
    }
    struct node *root = p.n ? block(&p, p.lines[0].indent) : NULL;
    free(p.lines);
    return root;
}

static struct node *get(struct node *m, const char *key) {
    if (!m || m->kind != MAP) return NULL;
    for (int i = 0; i < m->n; i++)
        if (!strcmp(m->kids[i]->key, key)) return m->kids[i];
    return NULL;
}

static const char *str(struct node *nd) { return nd && nd->kind == SCALAR ? nd->value : NULL; }

/* In a list of {name: ..., <inner>: {...}}, the inner map of the entry called name. */
static struct node *named(struct node *list, const char *name, const char *inner) {
    if (!list || list->kind != SEQ || !name) return NULL;
    for (int i = 0; i < list->n; i++) {
        const char *n = str(get(list->kids[i], "name"));
        if (n && !strcmp(n, name)) return get(list->kids[i], inner);
    }
    return NULL;
}

/* ---------- files ---------- */

struct blob {
    unsigned char *data;
    size_t len;
};

static int read_file(const char *path, struct blob *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t cap = 8192, len = 0;
    unsigned char *data = malloc(cap);
    size_t got;
    while ((got = fread(data + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2) data = realloc(data, cap *= 2);
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(data);
        return -1;
    }
    data[len] = 0;
    out->data = data;
    out->len = len;
    return 0;
}

static int same(const struct blob *a, const struct blob *b) {
    return a->len == b->len && a->data && b->data && !memcmp(a->data, b->data, a->len);
}

static void blob_free(struct blob *b) {
    free(b->data);
    b->data = NULL;
    b->len = 0;
}

static int base64(const char *s, struct blob *out) {
    size_t len = strlen(s);
    if (!len || len % 4) return -1;
    unsigned char *data = malloc(len + 1);
    int n = EVP_DecodeBlock(data, (const unsigned char *)s, (int)len);
    if (n < 0) {
        free(data);
        return -1;
    }
    for (size_t i = len; i > 0 && s[i - 1] == '='; i--) n--;
    data[n] = 0;
    out->data = data;
    out->len = (size_t)n;
    return 0;
}

/* ---------- what the probe uses ---------- */

struct config {
    char server[2048]; /* the kubeconfig's server, or -server with its path */
    char host[256], port[16], path[768];
    struct blob ca, cert, key; /* PEM */
};

static char error_text[2048];

static int fail_config(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return -1;
}

static void config_free(struct config *c) {
    blob_free(&c->ca);
    blob_free(&c->cert);
    blob_free(&c->key);
}

/* https://HOST[:PORT][/PATH] into its parts. */
static int split_url(const char *url, char *host, size_t hn, char *port, size_t pn, char *path, size_t an) {
    if (strncmp(url, "https://", 8)) return -1;
    const char *h = url + 8;
    const char *slash = strchr(h, '/');
    size_t authority = slash ? (size_t)(slash - h) : strlen(h);
    char auth[256];
    if (!authority || authority >= sizeof auth) return -1;
    memcpy(auth, h, authority);
    auth[authority] = 0;
    char *colon = strrchr(auth, ':');
    if (colon) {
        *colon = 0;
        snprintf(port, pn, "%s", colon + 1);
    } else {
        snprintf(port, pn, "443");
    }
    snprintf(host, hn, "%s", auth);
    snprintf(path, an, "%s", slash ? slash : "");
    size_t l = strlen(path);
    while (l && path[l - 1] == '/') path[--l] = 0;
    return 0;
}

static int load_kubeconfig(const char *file, const char *server_override, struct config *c) {
    memset(c, 0, sizeof *c);
    struct blob text;
    if (read_file(file, &text)) return fail_config("%s: %s", file, strerror(errno));
    struct node *doc = parse_yaml((char *)text.data);
    int rc = -1;
    const char *current = str(get(doc, "current-context"));
    struct node *context = named(get(doc, "contexts"), current, "context");
    struct node *cluster = named(get(doc, "clusters"), str(get(context, "cluster")), "cluster");
    struct node *user = named(get(doc, "users"), str(get(context, "user")), "user");
    const char *server = str(get(cluster, "server"));
    const char *ca = str(get(cluster, "certificate-authority-data"));
    const char *cert = str(get(user, "client-certificate-data"));
    const char *key = str(get(user, "client-key-data"));
    if (!server) {
        fail_config("no server for context \"%s\"", current ? current : "");
    } else if (!ca || base64(ca, &c->ca) || !strstr((char *)c->ca.data, "-----BEGIN")) {
        fail_config("context \"%s\": no certificate-authority-data", current);
    } else if (!cert || base64(cert, &c->cert) || !strstr((char *)c->cert.data, "-----BEGIN")) {
        fail_config("context \"%s\": no client-certificate-data", current);
    } else if (!key || base64(key, &c->key) || !strstr((char *)c->key.data, "-----BEGIN")) {
        fail_config("context \"%s\": no client-key-data", current);
    } else if (split_url(server, c->host, sizeof c->host, c->port, sizeof c->port, c->path, sizeof c->path)) {
        fail_config("the server %s is not an https URL", server);
    } else {
        if (server_override) {
            char path[768], ignore[16];
            snprintf(path, sizeof path, "%s", c->path);
            if (split_url(server_override, c->host, sizeof c->host, c->port, sizeof c->port, ignore, sizeof ignore)) {
                fail_config("-server %s is not an https URL", server_override);
                goto out;
            }
            snprintf(c->server, sizeof c->server, "https://%s:%s%s", c->host, c->port, path);
        } else {
            snprintf(c->server, sizeof c->server, "%s", server);
        }
        rc = 0;
    }
out:
    free_node(doc);
    blob_free(&text);
    if (rc) config_free(c);
    return rc;
}

/* ---------- TLS ---------- */

static void hex(const ASN1_OCTET_STRING *s, char *out, size_t n) {
    if (!s) {
        snprintf(out, n, "none");
        return;
    }
    out[0] = 0;
    for (int i = 0; i < ASN1_STRING_length(s) && (size_t)(i * 3 + 3) < n; i++)
        sprintf(out + (i ? i * 3 - 1 : 0), "%s%02x", i ? ":" : "", ASN1_STRING_get0_data(s)[i]);
}

static void rfc3339(const ASN1_TIME *t, char *out, size_t n) {
    struct tm tm;
    if (!t || !ASN1_TIME_to_tm(t, &tm)) {
        snprintf(out, n, "unknown");
        return;
    }
    strftime(out, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* One line naming a certificate: subject, issuer, key identifiers, serial, notAfter. */
static void describe(const char *what, int i, X509 *x) {
    char subject[512], issuer[512], ski[200], aki[200], end[64];
    X509_NAME_oneline(X509_get_subject_name(x), subject, sizeof subject);
    X509_NAME_oneline(X509_get_issuer_name(x), issuer, sizeof issuer);
    hex(X509_get0_subject_key_id(x), ski, sizeof ski);
    hex(X509_get0_authority_key_id(x), aki, sizeof aki);
    rfc3339(X509_get0_notAfter(x), end, sizeof end);
    char *serial = BN_bn2hex(ASN1_INTEGER_to_BN(X509_get0_serialNumber(x), NULL));
    printf("%s %d subject=%s issuer=%s authorityKeyId=%s subjectKeyId=%s serial=%s notAfter=%s\n", what, i, subject,
           issuer, aki, ski, serial ? serial : "?", end);
    OPENSSL_free(serial);
}

/* The client certificate's "cert" line and whether it has ended, or -1. */
static int cert_line(const struct blob *pem, char *out, size_t n, char *ended, size_t en) {
    BIO *bio = BIO_new_mem_buf(pem->data, (int)pem->len);
    X509 *leaf = PEM_read_bio_X509(bio, NULL, NULL, NULL);
    BIO_free(bio);
    if (!leaf) return -1;
    BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(leaf), NULL);
    char *serial = BN_bn2hex(bn);
    for (char *s = serial; *s; s++) *s = (char)(*s >= 'A' && *s <= 'F' ? *s - 'A' + 'a' : *s);
    const char *trimmed = serial;
    while (trimmed[0] == '0' && trimmed[1]) trimmed++;
    char end[64];
    rfc3339(X509_get0_notAfter(leaf), end, sizeof end);
    snprintf(out, n, "cert %s notAfter %s", trimmed, end);
    ended[0] = 0;
    if (X509_cmp_current_time(X509_get0_notAfter(leaf)) < 0)
        snprintf(ended, en, " (the client certificate ended at %s)", end);
    OPENSSL_free(serial);
    BN_free(bn);
    X509_free(leaf);
    return 0;
}

/* An SSL_CTX trusting the CA PEM (every certificate of it) and presenting the client certificate (its first
 * certificate the leaf, the rest its chain) with the key. */
static SSL_CTX *make_ctx(const struct blob *ca, const struct blob *cert, const struct blob *key) {
    SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
    if (!ctx) {
        fail_config("SSL_CTX_new failed");
        return NULL;
    }
    X509_STORE *store = SSL_CTX_get_cert_store(ctx);
    BIO *bio = BIO_new_mem_buf(ca->data, (int)ca->len);
    int cas = 0;
    for (X509 *x; (x = PEM_read_bio_X509(bio, NULL, NULL, NULL)); X509_free(x))
        if (X509_STORE_add_cert(store, x)) cas++;
    BIO_free(bio);
    ERR_clear_error();
    if (!cas) {
        SSL_CTX_free(ctx);
        fail_config("the CA holds no PEM certificate");
        return NULL;
    }
    /* As curl does by default (since 7.68): a CA of the bundle is a trust anchor even when it is not self-signed. */
    X509_STORE_set_flags(store, X509_V_FLAG_PARTIAL_CHAIN);
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
    bio = BIO_new_mem_buf(cert->data, (int)cert->len);
    X509 *leaf = PEM_read_bio_X509(bio, NULL, NULL, NULL);
    int ok = leaf && SSL_CTX_use_certificate(ctx, leaf);
    X509_free(leaf);
    for (X509 *x; ok && (x = PEM_read_bio_X509(bio, NULL, NULL, NULL));)
        if (!SSL_CTX_add0_chain_cert(ctx, x)) X509_free(x);
    BIO_free(bio);
    ERR_clear_error();
    bio = BIO_new_mem_buf(key->data, (int)key->len);
    EVP_PKEY *pkey = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
    BIO_free(bio);
    ok = ok && pkey && SSL_CTX_use_PrivateKey(ctx, pkey) && SSL_CTX_check_private_key(ctx);
    EVP_PKEY_free(pkey);
    if (!ok) {
        SSL_CTX_free(ctx);
        fail_config("client certificate and key: %s", ERR_reason_error_string(ERR_get_error()));
        ERR_clear_error();
        return NULL;
    }
    return ctx;
}

static void describe_trust(SSL_CTX *ctx) {
    STACK_OF(X509_OBJECT) *objs = X509_STORE_get0_objects(SSL_CTX_get_cert_store(ctx));
    for (int i = 0, n = 0; i < sk_X509_OBJECT_num(objs); i++) {
        X509 *x = X509_OBJECT_get0_X509(sk_X509_OBJECT_value(objs, i));
        if (x) describe("trust", n++, x);
    }
}

/* ---------- one request ---------- */

static char klass[16];

static int fail(const char *cls, const char *fmt, ...) {
    snprintf(klass, sizeof klass, "%s", cls);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_text, sizeof error_text, fmt, ap);
    va_end(ap);
    return -1;
}

static int is_timeout(void) { return errno == EAGAIN || errno == EWOULDBLOCK || errno == ETIMEDOUT; }

static int tls_failures_described, chain_described;

static int request(const struct config *c, SSL_CTX *ctx, const char *user) {
    struct addrinfo hints = {0}, *addrs;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(c->host, c->port, &hints, &addrs);
    if (rc) return fail("resolution", "lookup %s: %s", c->host, rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc));
    int fd = -1, last_errno = 0;
    struct timeval tv = {TIMEOUT_SECONDS, 0};
    for (struct addrinfo *a = addrs; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (!connect(fd, a->ai_addr, a->ai_addrlen)) break;
        last_errno = errno;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(addrs);
    if (fd < 0) {
        errno = last_errno;
        return fail(is_timeout() || errno == EINPROGRESS ? "timeout" : "connect", "connect %s:%s: %s", c->host,
                    c->port, strerror(last_errno));
    }
    SSL *ssl = SSL_new(ctx);
    SSL_set_fd(ssl, fd);
    SSL_set_tlsext_host_name(ssl, c->host);
    SSL_set1_host(ssl, c->host);
    int result = -1;
    errno = 0;
    int r = SSL_connect(ssl);
    if (r != 1) {
        int err = SSL_get_error(ssl, r);
        long verify = SSL_get_verify_result(ssl);
        if (err == SSL_ERROR_SYSCALL && is_timeout()) {
            fail("timeout", "TLS handshake with %s:%s: no answer in %ds", c->host, c->port, TIMEOUT_SECONDS);
        } else if (err == SSL_ERROR_SYSCALL && ERR_peek_last_error() == 0 && verify == X509_V_OK) {
            /* The server closed or reset the connection in the handshake (a pod stopping): no TLS alert, nothing
             * failed verification. Not a TLS failure: the Go probe calls the same "connect". */
            fail("connect", "TLS handshake with %s:%s: the connection ended: %s", c->host, c->port,
                 errno ? strerror(errno) : "end of file");
        } else {
            unsigned long e = ERR_peek_last_error();
            fail("tls", "TLS handshake with %s:%s: %s (verify: %s)", c->host, c->port,
                 e ? ERR_reason_error_string(e) : (err == SSL_ERROR_SYSCALL ? strerror(errno) : "failed"),
                 X509_verify_cert_error_string(verify));
            if (verify != X509_V_OK && tls_failures_described < 3) {
                tls_failures_described++;
                STACK_OF(X509) *chain = SSL_get_peer_cert_chain(ssl);
                for (int i = 0; chain && i < sk_X509_num(chain); i++) describe("chain", i, sk_X509_value(chain, i));
                describe_trust(ctx);
            }
        }
        ERR_clear_error();
        goto out;
    }
    {
        /* Whenever the server's certificate changes: its serial and its issuer's key, as the Go probe prints. */
        static char last_server[256];
        X509 *served = SSL_get0_peer_certificate(ssl);
        if (served) {
            char aki[200], line[256];
            hex(X509_get0_authority_key_id(served), aki, sizeof aki);
            BIGNUM *bn = ASN1_INTEGER_to_BN(X509_get0_serialNumber(served), NULL);
            char *serial = BN_bn2hex(bn);
            for (char *p = serial; p && *p; p++) *p = (char)(*p >= 'A' && *p <= 'F' ? *p - 'A' + 'a' : *p);
            const char *trimmed = serial ? serial : "?";
            while (trimmed[0] == '0' && trimmed[1]) trimmed++;
            snprintf(line, sizeof line, "server %s authorityKeyId %s", trimmed, aki);
            if (strcmp(line, last_server) != 0) {
                snprintf(last_server, sizeof last_server, "%s", line);
                printf("%s\n", line);
            }
            OPENSSL_free(serial);
            BN_free(bn);
        }
    }
    if (!chain_described) {
        /* Once: the chain the server sent and what it was checked against, for whoever reads the log. */
        chain_described = 1;
        STACK_OF(X509) *chain = SSL_get_peer_cert_chain(ssl);
        for (int i = 0; chain && i < sk_X509_num(chain); i++) describe("chain", i, sk_X509_value(chain, i));
        describe_trust(ctx);
    }
    const char *body = "{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"SelfSubjectReview\"}";
    char req[2048];
    int len = snprintf(req, sizeof req,
                       "POST %s/apis/authentication.k8s.io/v1/selfsubjectreviews HTTP/1.1\r\nHost: %s:%s\r\n"
                       "User-Agent: openssl-probe\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
                       "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                       c->path, c->host, c->port, strlen(body), body);
    if (SSL_write(ssl, req, len) != len) {
        fail(is_timeout() ? "timeout" : "connect", "sending the request: %s", strerror(errno));
        ERR_clear_error();
        goto out;
    }
    static char answer[1 << 16];
    size_t got = 0;
    for (;;) {
        errno = 0;
        int n = SSL_read(ssl, answer + got, (int)(sizeof answer - 1 - got));
        if (n > 0) {
            got += (size_t)n;
            if (got == sizeof answer - 1) break;
            continue;
        }
        int err = SSL_get_error(ssl, n);
        if (err == SSL_ERROR_SYSCALL && is_timeout()) {
            fail("timeout", "%s: no answer in %ds", c->server, TIMEOUT_SECONDS);
            ERR_clear_error();
            goto out;
        }
        break; /* close_notify, or the end of the connection */
    }
    ERR_clear_error();
    answer[got] = 0;
    int status = 0;
    if (sscanf(answer, "HTTP/%*s %d", &status) != 1) {
        fail("connect", "%s: no HTTP answer (%zu bytes)", c->server, got);
        goto out;
    }
    char *payload = strstr(answer, "\r\n\r\n");
    payload = payload ? payload + 4 : answer + got;
    for (char *p = payload; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    if (status != 201) {
        const char *cls = status == 401 ? "401" : status == 403 ? "403" : status >= 500 ? "5xx" : "http";
        fail(cls, "%s: %d %.300s", c->server, status, payload);
        goto out;
    }
    char want[300];
    snprintf(want, sizeof want, "\"username\":\"%s\"", user);
    if (!strstr(payload, want)) {
        fail("user", "the server does not say %s: %.300s", want, payload);
        goto out;
    }
    result = 0;
out:
    SSL_free(ssl);
    close(fd);
    return result;
}

/* ---------- the loop ---------- */

static void sleep_until(struct timespec *next, long every_ns) {
    next->tv_nsec += every_ns;
    while (next->tv_nsec >= 1000000000L) {
        next->tv_nsec -= 1000000000L;
        next->tv_sec++;
    }
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > next->tv_sec || (now.tv_sec == next->tv_sec && now.tv_nsec > next->tv_nsec)) {
        *next = now; /* behind: no burst to catch up */
        return;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, next, NULL) == EINTR) {
    }
}

static long duration_ns(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v <= 0) return -1;
    if (!strcmp(end, "ms")) return (long)(v * 1e6);
    if (!strcmp(end, "s")) return (long)(v * 1e9);
    return -1;
}

static int usage(void) {
    fprintf(stderr, "usage: openssl-probe -kubeconfig FILE -user NAME [-ca FILE] [-server https://HOST:PORT] "
                    "[-every 100ms] [-reload request|change|once]\n");
    return 2;
}

struct stamp {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
};

static int stamp_of(const char *path, struct stamp *s) {
    struct stat st;
    if (stat(path, &st)) return -1;
    *s = (struct stamp){st.st_dev, st.st_ino, st.st_size, st.st_mtim};
    return 0;
}

static int stamp_same(const struct stamp *a, const struct stamp *b) {
    return a->dev == b->dev && a->ino == b->ino && a->size == b->size && a->mtime.tv_sec == b->mtime.tv_sec &&
           a->mtime.tv_nsec == b->mtime.tv_nsec;
}

int main(int argc, char **argv) {
    const char *file = NULL, *user = NULL, *ca_file = NULL, *server = NULL, *reload = "request";
    long every = 100000000L;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (flag[0] == '-' && flag[1] == '-') flag++;
        if (i + 1 >= argc) return usage();
        const char *v = argv[++i];
        if (!strcmp(flag, "-kubeconfig")) file = v;
        else if (!strcmp(flag, "-user")) user = v;
        else if (!strcmp(flag, "-ca")) ca_file = v;
        else if (!strcmp(flag, "-server")) server = v;
        else if (!strcmp(flag, "-reload")) reload = v;
        else if (!strcmp(flag, "-every")) every = duration_ns(v);
        else return usage();
    }
    int mode = !strcmp(reload, "request") ? 0 : !strcmp(reload, "change") ? 1 : !strcmp(reload, "once") ? 2 : -1;
    if (!file || !user || every <= 0 || mode < 0) return usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    printf("openssl %s\n", OpenSSL_version(OPENSSL_VERSION));
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {0};
    sa.sa_flags = SA_RESTART;
    sa.sa_handler = on_hup;
    sigaction(SIGHUP, &sa, NULL);
    sa.sa_handler = on_term;
    sigaction(SIGTERM, &sa, NULL);

    /* Start-up: wait until the files can be read and the server's name resolves, as a hub waits for its
     * configuration; nothing is counted before. */
    for (int checks = 1;; checks++) {
        struct config c;
        int ok = !load_kubeconfig(file, server, &c);
        if (ok) {
            struct blob ca;
            ok = !ca_file || !read_file(ca_file, &ca);
            if (ca_file && ok) blob_free(&ca);
            struct addrinfo hints = {0}, *addrs;
            hints.ai_socktype = SOCK_STREAM;
            if (ok) ok = !getaddrinfo(c.host, c.port, &hints, &addrs);
            if (ok) freeaddrinfo(addrs);
            config_free(&c);
        }
        if (ok) {
            printf("ready after %d check(s)\n", checks);
            break;
        }
        if (term) return 0;
        if (checks == 1) printf("waiting for the files and the server's name\n");
        usleep(100000);
    }

    struct config cfg = {0};
    struct blob ca_text = {0};
    int have_cfg = 0, have_ca = 0;
    struct stamp kube_stamp = {0};
    SSL_CTX *ctx = NULL;
    char last_cert[256] = "";
    unsigned long requests = 0, failures = 0, certs = 0;
    struct timespec next, last_summary;
    clock_gettime(CLOCK_MONOTONIC, &next);
    last_summary = next;
    int first = 1;
    for (;; sleep_until(&next, every)) {
        requests++;
        int signalled = hup;
        hup = 0;
        /* What to read now. */
        struct stamp now_stamp;
        int read_kube = first || mode == 0 || signalled || !have_cfg ||
                        (mode == 1 && (stamp_of(file, &now_stamp) || !stamp_same(&now_stamp, &kube_stamp)));
        int read_ca = ca_file && (first || mode == 0 || signalled || !have_ca);
        first = 0;
        int changed = 0, bad = 0;
        if (read_kube) {
            struct stamp before;
            int stamped = !stamp_of(file, &before);
            struct config fresh;
            if (load_kubeconfig(file, server, &fresh)) {
                bad = 1;
            } else {
                if (!have_cfg || !same(&fresh.ca, &cfg.ca) || !same(&fresh.cert, &cfg.cert) ||
                    !same(&fresh.key, &cfg.key) || strcmp(fresh.server, cfg.server)) {
                    if (have_cfg) printf("reload kubeconfig%s\n", signalled ? " (SIGHUP)" : "");
                    changed = 1;
                }
                if (have_cfg) config_free(&cfg);
                cfg = fresh;
                have_cfg = 1;
                if (stamped) kube_stamp = before;
            }
        }
        if (!bad && read_ca) {
            struct blob fresh;
            if (read_file(ca_file, &fresh)) {
                bad = 1;
                fail_config("%s: %s", ca_file, strerror(errno));
            } else {
                if (!have_ca || !same(&fresh, &ca_text)) {
                    if (have_ca) printf("reload ca%s\n", signalled ? " (SIGHUP)" : "");
                    changed = 1;
                }
                blob_free(&ca_text);
                ca_text = fresh;
                have_ca = 1;
            }
        }
        if (!bad && (changed || !ctx)) {
            if (ctx) SSL_CTX_free(ctx);
            ctx = make_ctx(ca_file ? &ca_text : &cfg.ca, &cfg.cert, &cfg.key);
            if (!ctx) bad = 1;
        }
        int failed = bad;
        const char *cls = "config";
        char ended[128] = "";
        if (!bad) {
            char line[256];
            if (!cert_line(&cfg.cert, line, sizeof line, ended, sizeof ended) && strcmp(line, last_cert)) {
                certs++;
                snprintf(last_cert, sizeof last_cert, "%s", line);
                printf("%s\n", line);
            }
            /* SIGHUP and SIGTERM wait until the request is over: a signal arriving in a socket call with a timeout
             * set makes it fail with EINTR even with SA_RESTART (signal(7)), which would count as a failure of
             * the server. */
            sigset_t signals, before;
            sigemptyset(&signals);
            sigaddset(&signals, SIGHUP);
            sigaddset(&signals, SIGTERM);
            sigprocmask(SIG_BLOCK, &signals, &before);
            int r = request(&cfg, ctx, user);
            sigprocmask(SIG_SETMASK, &before, NULL);
            if (r) {
                failed = 1;
                cls = klass;
            }
        }
        if (failed) {
            failures++;
            printf("fail %lu %s %s%s\n", requests, cls, error_text, ended);
        }
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (term || now.tv_sec - last_summary.tv_sec >= 1 + (now.tv_nsec < last_summary.tv_nsec)) {
            last_summary = now;
            printf("requests %lu failures %lu certs %lu\n", requests, failures, certs);
        }
        if (term) return 0;
    }
}
