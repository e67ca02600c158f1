package etcdtest

import (
	"fmt"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/fencekit/fencekit/internal/harness/testenv"
)

// tb is what starting a cluster needs of a test: a testing.TB, or the
// package's own for the cluster its tests share (shared.go).
type tb interface {
	Helper()
	Fatal(args ...any)
	TempDir() string
	Cleanup(func())
}

// Cluster is an etcd cluster of members started in this process.
type Cluster struct {
	t       tb
	mu      sync.Mutex
	Members []*Member
	// Peers stands between the members on their peer ports: it can cut a
	// member off from the others.
	Peers *Partition
}

// Member is one member of a Cluster. Proxy stands between clients and the
// member's client port: blocking it cuts the member off from clients that
// reach it through ClientURL, cutting it breaks their connections.
type Member struct {
	Name      string
	dir       string
	peerURL   string // the member's own peer port
	advertise string // its peer address through the Partition
	clientURL string // the member's own client port
	memberID  atomic.Pointer[string]
	initial   string
	etcd      *embed.Etcd
	Proxy     *testenv.Proxy
}

// ClientURL is the member's address through its proxy (its own, in the
// shared cluster, which has no proxies).
func (m *Member) ClientURL() string {
	if m.Proxy == nil {
		return m.clientURL
	}
	return "http://" + m.Proxy.Addr()
}

// DirectURL is the member's own client address, bypassing the proxy.
func (m *Member) DirectURL() string { return m.clientURL }

func freePort(t tb) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// StartCluster starts n members on free loopback ports and waits until
// they serve; the test's cleanup stops them. A port taken by another
// process between its choice and its use makes it start again on others.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	return startClusterOf(t, n, true)
}

func startClusterOf(t tb, n int, proxies bool) *Cluster {
	t.Helper()
	var err error
	for range 5 {
		var c *Cluster
		if c, err = startCluster(t, n, proxies); err == nil {
			return c
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	t.Fatal(err)
	return nil
}

func startCluster(t tb, n int, proxies bool) (*Cluster, error) {
	c := &Cluster{t: t, Peers: newPartition(t)}
	var initial []string
	for i := range n {
		m := &Member{
			Name:      fmt.Sprintf("m%d", i),
			dir:       t.TempDir(),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
			clientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		}
		m.advertise = "http://" + c.Peers.listen(t, m, strings.TrimPrefix(m.peerURL, "http://"))
		initial = append(initial, m.Name+"="+m.advertise)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		m.initial = strings.Join(initial, ",")
		if proxies {
			m.Proxy = testenv.StartProxy(t.(testing.TB), strings.TrimPrefix(m.clientURL, "http://"))
		}
	}
	errs := make(chan error, n)
	for _, m := range c.Members {
		go func() { errs <- m.start() }()
	}
	var first error
	for range n {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	if first != nil {
		for _, m := range c.Members {
			m.stop()
		}
		return nil, first
	}
	t.Cleanup(func() {
		for _, m := range c.Members {
			m.stop()
		}
	})
	return c, nil
}

func (m *Member) config() *embed.Config {
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.dir
	pu, _ := url.Parse(m.peerURL)
	au, _ := url.Parse(m.advertise)
	cu, _ := url.Parse(m.clientURL)
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*au}
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.InitialCluster = m.initial
	cfg.InitialClusterToken = "fencekit-etcdtest"
	cfg.ClusterState = embed.ClusterStateFlagNew
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	// The default timings (100ms heartbeats, 1s elections), and fsync as
	// etcd does it: the faults are real ones.
	return cfg
}

func (m *Member) start() error {
	e, err := embed.StartEtcd(m.config())
	if err != nil {
		return fmt.Errorf("etcdtest: start %s: %w", m.Name, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return fmt.Errorf("etcdtest: %s: %w", m.Name, err)
	case <-time.After(30 * time.Second):
		e.Close()
		return fmt.Errorf("etcdtest: %s not ready after 30s", m.Name)
	}
	m.etcd = e
	id := e.Server.MemberID().String()
	m.memberID.Store(&id)
	return nil
}

// id is the member's id as etcd writes it in its peer requests.
func (m *Member) id() string {
	if id := m.memberID.Load(); id != nil {
		return *id
	}
	return ""
}

func (m *Member) stop() {
	if m.etcd != nil {
		m.etcd.Close()
		m.etcd = nil
	}
}

// Client returns a client of every member, through their proxies; the
// test's cleanup closes it.
func (c *Cluster) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	var eps []string
	for _, m := range c.Members {
		eps = append(eps, m.ClientURL())
	}
	return c.ClientOf(t, eps...)
}

// ClientOf returns a client of the given endpoints.
func (c *Cluster) ClientOf(t testing.TB, endpoints ...string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientConfig(endpoints...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

func clientConfig(endpoints ...string) clientv3.Config {
	return clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second,
		DialKeepAliveTime: time.Second, DialKeepAliveTimeout: time.Second}
}

// Leader returns the index of the member that leads, waiting up to 30s for
// one.
func (c *Cluster) Leader(t testing.TB) int {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		for i, m := range c.Members {
			if m.etcd != nil && m.etcd.Server.Leader() == m.etcd.Server.MemberID() && m.etcd.Server.Leader() != 0 {
				c.mu.Unlock()
				return i
			}
		}
		c.mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("etcdtest: no leader after 30s")
	return -1
}

// Stop stops member i, as a crash of its process would (its data stays).
func (c *Cluster) Stop(i int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.Members[i].stop()
}

// Restart starts member i again on its data and ports.
func (c *Cluster) Restart(t testing.TB, i int) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	var err error
	for range 50 { // the ports may take a moment to be free again
		if err = c.Members[i].start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal(err)
}

// memberLeader is the leader member m knows of; 0 for none.
func (c *Cluster) memberLeader(m *Member) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	if m.etcd == nil {
		return 0
	}
	return uint64(m.etcd.Server.Leader())
}
